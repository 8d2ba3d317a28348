"""The prefill node's /metrics agree with the prefills made: prompt tokens received, one
generated token each, prefix-cache hits and lookups, one latency sample per request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from node_harness import (
    BLOCK_SIZE,
    metric,
    node_settings,
    prefill,
    scrape,
    serving,
    wait_idle,
)

from cluster.protocol import PrefillResponse
from models.sampling_params import SamplingParams
from prefill_node.app import create_app

pytestmark = pytest.mark.asyncio(loop_scope="module")

SPEC = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
PROMPT = [7, 9, 17, 33, 4, 8, 12, 40, 41]  # 2 full blocks of 4, then 1 token


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def node(model_dir: Path, redis_url: str) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    settings = node_settings(model_dir, redis_url, "prefill")
    async with serving(create_app(settings), settings) as client:
        yield client, settings.resolved_node_id()


async def _prefill(client: httpx.AsyncClient, rid: str) -> PrefillResponse:
    return await prefill(client, rid, PROMPT, SPEC)


async def test_counters_match_the_prefills(node: tuple[httpx.AsyncClient, str]) -> None:
    client, node_id = node
    labels = {"role": "prefill", "node": node_id}
    n = 3
    for i in range(n):
        await _prefill(client, f"p{i}")
    await wait_idle(client)
    samples = await scrape(client)
    assert metric(samples, "splitserve_requests_total", **labels) == n
    assert metric(samples, "splitserve_prompt_tokens_total", **labels) == n * len(PROMPT)
    assert metric(samples, "splitserve_generation_tokens_total", **labels) == n
    for name in ("queue_time", "ttft"):
        assert metric(samples, f"splitserve_{name}_seconds_count", **labels) == n
    # the first prefill fills the cache; each later one finds both full blocks there
    full = len(PROMPT) // BLOCK_SIZE * BLOCK_SIZE
    assert metric(samples, "splitserve_prefix_cache_hit_tokens_total", **labels) == (n - 1) * full
    assert metric(samples, "splitserve_prefix_cache_query_tokens_total", **labels) == n * len(
        PROMPT
    )
    assert metric(samples, "splitserve_waiting_requests", **labels) == 0
    assert metric(samples, "splitserve_kv_leases", **labels) == 0
