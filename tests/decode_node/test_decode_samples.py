"""Parallel samples of one prompt on a decode node (what the router does for n > 1): sample 0
imports the prefill node's blocks once; the others, sent once sample 0 streams, prefill
locally beside it and get the prompt's full blocks from the prefix cache (shared, only the
partial last block computed again). Each seeded sample gives what that seed gives alone, and
every block is free again after the samples end, aborted ones included."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from node_harness import (
    BLOCK_SIZE,
    NUM_BLOCKS,
    generate,
    node_settings,
    offline_tokens,
    serving,
    stats,
    tokens_of,
    wait_idle,
)

from cluster.protocol import DecodeRequest, PrefillResponse, TokenEvent
from decode_node.app import create_app as decode_app
from models.sampling_params import SamplingParams
from prefill_node.app import create_app as prefill_app

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROMPT = [5, 9, 17, 33, 4, 8, 12, 40, 41, 50, 51]  # 11 tokens: 2 full blocks of 4 + 3
SEEDS = [101, 7_000_001, 42, 9]
SPEC = SamplingParams(max_tokens=6, temperature=1.0, ignore_eos=True)
HEADERS = {"content-type": "application/json"}
DECODE_BLOCKS = 256  # room for 4 samples of 150 tokens


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pair(model_dir: Path, redis_url: str) -> AsyncIterator[tuple[httpx.AsyncClient, ...]]:
    specs = [
        node_settings(model_dir, redis_url, "prefill"),
        node_settings(model_dir, redis_url, "decode", num_kv_blocks=DECODE_BLOCKS),
    ]
    async with (
        serving(prefill_app(specs[0]), specs[0]) as prefill,
        serving(decode_app(specs[1]), specs[1]) as decode,
    ):
        yield prefill, decode


def _spec(seed: int, max_tokens: int = 6) -> SamplingParams:
    return dataclasses.replace(SPEC, seed=seed, max_tokens=max_tokens)


async def _prefill(node: httpx.AsyncClient, rid: str, spec: SamplingParams) -> PrefillResponse:
    body = {"request_id": rid, "prompt_token_ids": PROMPT, "sampling": dataclasses.asdict(spec)}
    resp = await node.post("/internal/prefill", json=body)
    assert resp.status_code == 200, resp.text
    return PrefillResponse.model_validate_json(resp.content)


async def _samples(
    prefill: httpx.AsyncClient, decode: httpx.AsyncClient, tag: str, max_tokens: int = 6
) -> tuple[list[int], list[list[TokenEvent]]]:
    """Sample 0 through prefill + import, the others beside it once it streams."""
    answer = await _prefill(prefill, f"{tag}-0", _spec(SEEDS[0], max_tokens))
    first = DecodeRequest(
        request_id=f"{tag}-0",
        prompt_token_ids=PROMPT,
        output_token_ids=[answer.first_token_id],
        sampling=_spec(SEEDS[0], max_tokens),
        kv=answer.kv,
    )
    events: list[TokenEvent] = []
    body = first.model_dump_json()
    async with decode.stream("POST", "/internal/generate", content=body, headers=HEADERS) as r:
        lines = r.aiter_lines()
        events.append(TokenEvent.model_validate_json(await anext(lines)))
        siblings = [
            DecodeRequest(
                request_id=f"{tag}-{i}", prompt_token_ids=PROMPT, sampling=_spec(s, max_tokens)
            )
            for i, s in enumerate(SEEDS[1:], 1)
        ]
        others = asyncio.gather(*(generate(decode, req) for req in siblings))
        events += [TokenEvent.model_validate_json(line) async for line in lines if line.strip()]
        rest = await others
    return [answer.first_token_id, *tokens_of(events)], rest


async def test_samples_share_the_imported_prompt_and_match_their_seeds(
    pair: tuple[httpx.AsyncClient, ...], model_dir: Path
) -> None:
    prefill, decode = pair
    before = (await stats(decode)).counters
    first, rest = await _samples(prefill, decode, "share")
    after = (await stats(decode)).counters
    assert after["imports_total"] - before.get("imports_total", 0) == 1
    assert after["local_prefills_total"] - before.get("local_prefills_total", 0) == 3
    full = len(PROMPT) // BLOCK_SIZE * BLOCK_SIZE
    assert [events[0].num_cached_tokens for events in rest] == [full] * 3  # blocks shared
    wants = [offline_tokens(model_dir, PROMPT, _params(seed)) for seed in SEEDS]
    assert [first, *(tokens_of(events) for events in rest)] == wants
    assert len({tuple(w) for w in wants}) > 1  # the seeds do differ
    idle = await wait_idle(decode)
    assert (idle.load.running, idle.load.free_blocks) == (0, DECODE_BLOCKS)
    assert (await wait_idle(prefill)).load.free_blocks == NUM_BLOCKS


async def test_aborted_samples_free_every_block(pair: tuple[httpx.AsyncClient, ...]) -> None:
    prefill, decode = pair

    async def abort_soon() -> None:
        while (await stats(decode)).load.running < len(SEEDS):
            await asyncio.sleep(0.01)
        for i in (0, 2):
            await decode.post("/internal/abort", json={"request_id": f"abort-{i}"})

    aborter = asyncio.create_task(abort_soon())
    first, rest = await _samples(prefill, decode, "abort", max_tokens=150)
    await aborter
    assert len(first) < 150 and len(tokens_of(rest[1])) < 150  # samples 0 and 2 stopped early
    assert rest[1][-1].finish_reason == "abort"
    assert [len(tokens_of(rest[0])), len(tokens_of(rest[2]))] == [150, 150]
    idle = await wait_idle(decode)
    assert (idle.load.running, idle.load.free_blocks) == (0, DECODE_BLOCKS)


def _params(seed: int) -> SamplingParams:
    return _spec(seed)
