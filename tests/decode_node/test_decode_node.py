"""The decode node: KV handed over from a prefill node gives the offline engine's output;
a failed transfer recomputes (same output) or fails by setting; aborts and disconnects free
the blocks; the colocated role prefills alone."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from node_harness import (
    NUM_BLOCKS,
    generate,
    node_settings,
    offline_tokens,
    serving,
    stats,
    tokens_of,
    wait_idle,
)

from cluster.protocol import DecodeRequest, KVHandle, PrefillResponse, TokenEvent
from decode_node.app import create_app as decode_app
from kv_transfer import PeerInfo
from launcher.redis_server import free_port
from models.sampling_params import SamplingParams
from prefill_node.app import create_app as prefill_app

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROMPT = [5, 9, 17, 33, 4, 8, 12, 40, 41]  # 9 tokens: 3 blocks of 4
SPEC = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
JSON = {"content-type": "application/json"}
PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@dataclasses.dataclass
class Nodes:
    prefill: httpx.AsyncClient
    decode: httpx.AsyncClient
    failing: httpx.AsyncClient  # transfer_failure=fail
    colocated: httpx.AsyncClient


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def nodes(model_dir: Path, redis_url: str) -> AsyncIterator[Nodes]:
    specs = [
        node_settings(model_dir, redis_url, "prefill"),
        node_settings(model_dir, redis_url, "decode"),
        node_settings(model_dir, redis_url, "decode", transfer_failure="fail"),
        node_settings(model_dir, redis_url, "colocated"),
    ]
    apps = [prefill_app(specs[0])] + [decode_app(s) for s in specs[1:]]
    async with (
        serving(apps[0], specs[0]) as prefill,
        serving(apps[1], specs[1]) as decode,
        serving(apps[2], specs[2]) as failing,
        serving(apps[3], specs[3]) as colocated,
    ):
        yield Nodes(prefill, decode, failing, colocated)


@pytest.fixture(scope="module")
def expected(model_dir: Path) -> list[int]:
    return offline_tokens(model_dir, PROMPT, PARAMS)


async def _prefill(node: httpx.AsyncClient, rid: str, prompt: list[int]) -> PrefillResponse:
    body = {"request_id": rid, "prompt_token_ids": prompt, "sampling": dataclasses.asdict(SPEC)}
    resp = await node.post("/internal/prefill", json=body)
    assert resp.status_code == 200, resp.text
    return PrefillResponse.model_validate_json(resp.content)


def _decode_req(rid: str, answer: PrefillResponse, prompt: list[int] = PROMPT) -> DecodeRequest:
    return DecodeRequest(
        request_id=rid,
        prompt_token_ids=prompt,
        output_token_ids=[answer.first_token_id],
        sampling=SPEC,
        kv=answer.kv,
    )


def _broken(kv: KVHandle) -> KVHandle:
    """The same lease, but from a peer process whose block server is gone."""
    peer = PeerInfo.from_json(kv.peer_info)
    peer = dataclasses.replace(peer, incarnation=f"gone{free_port()}", tcp_port=free_port())
    return kv.model_copy(update={"peer_info": peer.to_json()})


async def test_kv_handoff_gives_the_offline_output(nodes: Nodes, expected: list[int]) -> None:
    answer = await _prefill(nodes.prefill, "hand", PROMPT)
    events = await generate(nodes.decode, _decode_req("hand", answer))
    assert [answer.first_token_id, *tokens_of(events)] == expected
    last = events[-1]
    assert last.finished and last.finish_reason == "length" and last.error is None
    assert (last.num_prompt_tokens, last.num_cached_tokens) == (len(PROMPT), len(PROMPT))
    prefill_idle = await wait_idle(nodes.prefill)  # the READ's notice ended the lease
    assert (prefill_idle.load.leases_held, prefill_idle.load.free_blocks) == (0, NUM_BLOCKS)
    decode_idle = await wait_idle(nodes.decode)
    assert decode_idle.load.free_blocks == NUM_BLOCKS
    assert decode_idle.counters["imports_total"] >= 1


async def test_logprobs_come_with_every_token(nodes: Nodes) -> None:
    spec = dataclasses.replace(SPEC, logprobs=2)
    body = {"request_id": "lp", "prompt_token_ids": PROMPT, "sampling": dataclasses.asdict(spec)}
    answer = PrefillResponse.model_validate_json(
        (await nodes.prefill.post("/internal/prefill", json=body)).content
    )
    assert answer.first_logprob is not None
    assert answer.first_logprob.token_id == answer.first_token_id
    req = _decode_req("lp", answer).model_copy(update={"sampling": spec})
    events = await generate(nodes.decode, req)
    for event in events:
        assert event.logprobs is not None and len(event.logprobs) == len(event.token_ids)
        for token, logprob in zip(event.token_ids, event.logprobs, strict=True):
            assert logprob.token_id == token and len(logprob.top) == 2 and logprob.logprob <= 0


async def test_fully_cached_prompt_reads_nothing_and_ends_the_lease(
    nodes: Nodes, model_dir: Path
) -> None:
    prompt = [11, 12, 13, 14, 15, 16, 17, 18]  # two full blocks
    want = offline_tokens(model_dir, prompt, PARAMS)
    moved, hits = [], []
    for rid in ("cached-1", "cached-2"):  # the second finds both blocks in the decode cache
        before = (await stats(nodes.decode)).counters.get("imported_blocks_total", 0)
        answer = await _prefill(nodes.prefill, rid, prompt)
        events = await generate(nodes.decode, _decode_req(rid, answer, prompt))
        assert [answer.first_token_id, *tokens_of(events)] == want
        moved.append((await stats(nodes.decode)).counters["imported_blocks_total"] - before)
        hits.append(events[0].num_prefix_hit_tokens)  # what the router counts as actual hits
    assert moved == [2, 0]  # a release notice alone ended the second lease
    assert hits == [0, 8]
    idle = await wait_idle(nodes.prefill, timeout_s=3.0)  # lease_ttl_s is 30 s
    assert idle.load.leases_held == 0


async def test_local_prefill_and_resume_give_the_offline_output(
    nodes: Nodes, expected: list[int]
) -> None:
    local = DecodeRequest(request_id="local", prompt_token_ids=PROMPT, sampling=SPEC)
    assert tokens_of(await generate(nodes.decode, local)) == expected
    resume = local.model_copy(update={"request_id": "resume", "output_token_ids": expected[:3]})
    events = await generate(nodes.decode, resume)
    assert tokens_of(events) == expected[3:]
    assert events[-1].num_prompt_tokens == len(PROMPT)


async def test_transfer_failure_recomputes_the_same_output(
    nodes: Nodes, expected: list[int]
) -> None:
    before = (await stats(nodes.decode)).counters
    answer = await _prefill(nodes.prefill, "broken", PROMPT)
    assert answer.kv is not None
    req = _decode_req("broken", answer).model_copy(update={"kv": _broken(answer.kv)})
    events = await generate(nodes.decode, req)
    assert [answer.first_token_id, *tokens_of(events)] == expected
    after = (await wait_idle(nodes.decode)).counters
    assert after["transfer_failures_total"] == before.get("transfer_failures_total", 0) + 1
    assert after["recomputes_total"] == before.get("recomputes_total", 0) + 1
    await nodes.prefill.post("/internal/release", json={"request_id": "broken"})


async def test_transfer_failure_fails_the_request_when_set(nodes: Nodes) -> None:
    answer = await _prefill(nodes.prefill, "fails", PROMPT)
    assert answer.kv is not None
    req = _decode_req("fails", answer).model_copy(update={"kv": _broken(answer.kv)})
    events = await generate(nodes.failing, req)
    assert events[-1].finish_reason == "error" and events[-1].error is not None
    assert events[-1].error.code == "transfer_failed"
    assert (await wait_idle(nodes.failing)).load.free_blocks == NUM_BLOCKS
    await nodes.prefill.post("/internal/release", json={"request_id": "fails"})


def _long(rid: str) -> DecodeRequest:
    spec = dataclasses.replace(SPEC, max_tokens=200)
    return DecodeRequest(request_id=rid, prompt_token_ids=PROMPT, sampling=spec)


async def test_abort_ends_the_stream_and_frees_the_blocks(nodes: Nodes) -> None:
    events: list[TokenEvent] = []
    body = _long("abort-me").model_dump_json()
    headers = {"content-type": "application/json"}
    async with nodes.decode.stream(
        "POST", "/internal/generate", content=body, headers=headers
    ) as r:
        async for line in r.aiter_lines():
            events.append(TokenEvent.model_validate_json(line))
            if len(events) == 1:
                done = await nodes.decode.post("/internal/abort", json={"request_id": "abort-me"})
                assert done.json()["done"] is True
    assert events[-1].finish_reason == "abort"
    assert len(tokens_of(events)) < 200
    assert (await wait_idle(nodes.decode)).load.free_blocks == NUM_BLOCKS
    again = await nodes.decode.post("/internal/abort", json={"request_id": "abort-me"})
    assert again.json()["done"] is False


async def test_client_disconnect_cancels_the_decode(nodes: Nodes) -> None:
    before = (await stats(nodes.decode)).counters.get("streams_cut_total", 0)
    body = _long("gone").model_dump_json()
    headers = {"content-type": "application/json"}
    async with nodes.decode.stream(
        "POST", "/internal/generate", content=body, headers=headers
    ) as r:
        async for _ in r.aiter_lines():
            break  # the client leaves after the first event
    idle = await wait_idle(nodes.decode)
    assert (idle.load.running, idle.load.free_blocks) == (0, NUM_BLOCKS)
    assert idle.counters["streams_cut_total"] == before + 1


async def test_colocated_node_prefills_alone(nodes: Nodes, expected: list[int]) -> None:
    local = DecodeRequest(request_id="colo", prompt_token_ids=PROMPT, sampling=SPEC)
    assert tokens_of(await generate(nodes.colocated, local)) == expected
    answer = await _prefill(nodes.prefill, "colo-kv", PROMPT)
    body = _decode_req("colo-kv", answer).model_dump_json()
    resp = await nodes.colocated.post("/internal/generate", content=body, headers=JSON)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "kv"
    assert (await stats(nodes.colocated)).info.role == "colocated"
    await nodes.prefill.post("/internal/release", json={"request_id": "colo-kv"})


async def test_nodes_report_the_requests_they_hold(nodes: Nodes) -> None:
    """What the router sizes its admission from: each node's batch (64 on the CPU) and the
    KV imports a decode node queues (as many, by default)."""
    prefill, decode = (await stats(nodes.prefill)).info, (await stats(nodes.decode)).info
    assert (prefill.max_num_seqs, prefill.max_queued) == (64, 0)
    assert (decode.max_num_seqs, decode.max_queued) == (64, 64)


async def test_a_body_that_is_no_decode_request_answers_400(nodes: Nodes) -> None:
    for raw, param in [(b"{not json", None), (b'{"request_id": "x"}', "prompt_token_ids")]:
        resp = await nodes.decode.post("/internal/generate", content=raw, headers=JSON)
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["code"] == "bad_request" and error["param"] == param, error


async def test_bad_requests_answer_400(nodes: Nodes) -> None:
    answer = await _prefill(nodes.prefill, "bad", PROMPT)
    assert answer.kv is not None
    good = _decode_req("bad", answer)
    bad = {
        "sampling": good.model_copy(update={"output_token_ids": [1] * 8}),
        "output_token_ids": good.model_copy(update={"output_token_ids": []}),
        "kv.num_tokens": good.model_copy(
            update={"kv": answer.kv.model_copy(update={"num_tokens": 4})}
        ),
        "kv.layout_fingerprint": good.model_copy(
            update={"kv": answer.kv.model_copy(update={"layout_fingerprint": "other"})}
        ),
        "prompt_token_ids": DecodeRequest(
            request_id="bad-ids", prompt_token_ids=[500], sampling=SPEC
        ),
    }
    for param, req in bad.items():
        body = req.model_dump_json()
        resp = await nodes.decode.post("/internal/generate", content=body, headers=JSON)
        assert resp.status_code == 400, (param, resp.text)
        assert resp.json()["error"]["param"] == param
    idle = await wait_idle(nodes.decode)
    assert idle.load.free_blocks == NUM_BLOCKS
    await nodes.prefill.post("/internal/release", json={"request_id": "bad"})
