"""The decode node's /metrics agree with the requests made: prompt and generated tokens, KV
transfers (count, bytes, failures by kind), recomputes, and one latency sample per request."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from node_harness import (
    BLOCK_SIZE,
    Samples,
    generate,
    metric,
    node_settings,
    scrape,
    serving,
    stats,
    tokens_of,
    wait_idle,
)

from cluster.protocol import DecodeRequest, KVHandle, PrefillResponse
from decode_node.app import create_app as decode_app
from kv_transfer import PeerInfo
from launcher.redis_server import free_port
from models.sampling_params import SamplingParams
from prefill_node.app import create_app as prefill_app

pytestmark = pytest.mark.asyncio(loop_scope="module")

SPEC = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
N = 3


def _prompt(i: int) -> list[int]:
    """9 tokens (3 blocks of KV with the first token); distinct first blocks, no cache hits."""
    return [60 + i, 9, 17, 33, 4, 8, 12, 40, 41]


@dataclasses.dataclass
class Pair:
    prefill: httpx.AsyncClient
    decode: httpx.AsyncClient
    decode_id: str


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pair(model_dir: Path, redis_url: str) -> AsyncIterator[Pair]:
    p_set = node_settings(model_dir, redis_url, "prefill")
    d_set = node_settings(model_dir, redis_url, "decode")
    async with (
        serving(prefill_app(p_set), p_set) as prefill,
        serving(decode_app(d_set), d_set) as decode,
    ):
        yield Pair(prefill, decode, d_set.resolved_node_id())


async def _prefill(node: httpx.AsyncClient, rid: str, prompt: list[int]) -> PrefillResponse:
    body = {"request_id": rid, "prompt_token_ids": prompt, "sampling": dataclasses.asdict(SPEC)}
    resp = await node.post("/internal/prefill", json=body)
    assert resp.status_code == 200, resp.text
    return PrefillResponse.model_validate_json(resp.content)


def _decode_req(rid: str, answer: PrefillResponse, prompt: list[int]) -> DecodeRequest:
    return DecodeRequest(
        request_id=rid,
        prompt_token_ids=prompt,
        output_token_ids=[answer.first_token_id],
        sampling=SPEC,
        kv=answer.kv,
    )


def _delta(after: Samples, before: Samples, name: str, **labels: str) -> float:
    return metric(after, name, **labels) - metric(before, name, **labels)


async def test_counters_and_histograms_match_the_handoffs(pair: Pair) -> None:
    before = await scrape(pair.decode)
    before_blocks = (await stats(pair.decode)).counters.get("imported_blocks_total", 0)
    streamed = prompt_tokens = 0
    block_bytes = 0
    for i in range(N):
        answer = await _prefill(pair.prefill, f"m{i}", _prompt(i))
        assert answer.kv is not None
        block_bytes = PeerInfo.from_json(answer.kv.peer_info).block_bytes
        events = await generate(pair.decode, _decode_req(f"m{i}", answer, _prompt(i)))
        streamed += len(tokens_of(events))
        prompt_tokens += len(_prompt(i))
    idle = await wait_idle(pair.decode)
    after = await scrape(pair.decode)

    labels = {"role": "decode", "node": pair.decode_id}
    assert _delta(after, before, "splitserve_generation_tokens_total", **labels) == streamed
    assert _delta(after, before, "splitserve_prompt_tokens_total", **labels) == prompt_tokens
    assert _delta(after, before, "splitserve_requests_total", **labels) == N
    assert _delta(after, before, "splitserve_kv_transfer_seconds_count", **labels) == N
    blocks = idle.counters["imported_blocks_total"] - before_blocks
    assert blocks == N * -(-len(_prompt(0)) // BLOCK_SIZE)
    moved = _delta(after, before, "splitserve_kv_transfer_bytes_total", **labels)
    assert moved == blocks * block_bytes
    assert _delta(after, before, "splitserve_kv_transfer_failures_total") == 0
    for name in ("queue_time", "ttft", "e2e"):
        assert _delta(after, before, f"splitserve_{name}_seconds_count", **labels) == N
    assert metric(after, "splitserve_kv_usage_ratio", **labels) == 0.0
    assert metric(after, "splitserve_running_requests", **labels) == 0.0


def _broken(kv: KVHandle) -> KVHandle:
    """The same lease, but from a peer process whose block server is gone."""
    peer = PeerInfo.from_json(kv.peer_info)
    peer = dataclasses.replace(peer, incarnation=f"gone{free_port()}", tcp_port=free_port())
    return kv.model_copy(update={"peer_info": peer.to_json()})


async def test_a_failed_transfer_counts_a_failure_by_kind_and_a_recompute(pair: Pair) -> None:
    before = await scrape(pair.decode)
    answer = await _prefill(pair.prefill, "broken", _prompt(9))
    assert answer.kv is not None
    req = _decode_req("broken", answer, _prompt(9)).model_copy(update={"kv": _broken(answer.kv)})
    events = await generate(pair.decode, req)
    assert events[-1].error is None
    after = await scrape(pair.decode)
    assert _delta(after, before, "splitserve_kv_transfer_failures_total", kind="peer") == 1
    assert _delta(after, before, "splitserve_kv_transfer_failures_total") == 1
    assert _delta(after, before, "splitserve_kv_recomputes_total") == 1
    assert _delta(after, before, "splitserve_kv_transfer_seconds_count") == 0
    assert _delta(after, before, "splitserve_generation_tokens_total") == len(tokens_of(events))
    await pair.prefill.post("/internal/release", json={"request_id": "broken"})
