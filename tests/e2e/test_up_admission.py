"""`splitserve up` with one decode slot (--max-num-seqs 1): priorities decide who goes next,
and a flood far past capacity queues instead of failing.

(1) While a long request holds the slot, ten priority-5 requests and then one priority-0
request arrive; the priority-0 one finishes first. The decode node queues 16 requests
(SPLITSERVE_MAX_QUEUED_IMPORTS), so the router's admission, sized from that, sends all of
them there and the node's queue orders them. (2) 3x the node's capacity (slot + a
short queue) at once: every request completes or gets 429 before any token, none gets a 5xx,
and afterwards every KV block is free and no lease is held."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cluster_harness import Cluster, running_cluster

pytestmark = pytest.mark.e2e

PROMPT = "In the middle of the night, the city was quiet except for the sound of the rain and"


@pytest.fixture(scope="module")
def cluster(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    run_dir = tmp_path_factory.mktemp("up-admission")
    args = ("--max-num-seqs", "1", "--num-kv-blocks", "128")
    env = {"SPLITSERVE_MAX_QUEUED_IMPORTS": "16"}
    with running_cluster(default_model_dir, run_dir, *args, check_clean_exit=True, env=env) as up:
        yield up


def _body(max_tokens: int, priority: int = 0, stream: bool = False) -> dict[str, Any]:
    return {
        "model": "smollm2", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, "priority": priority, "stream": stream,
    }  # fmt: skip


async def _timed(http: httpx.AsyncClient, body: dict[str, Any], done: list[str], name: str) -> int:
    resp = await http.post("/v1/completions", json=body)
    done.append(name)
    return resp.status_code


async def _priorities(cluster: Cluster) -> tuple[list[str], list[int]]:
    done: list[str] = []
    async with httpx.AsyncClient(base_url=cluster.base_url, timeout=120, trust_env=False) as http:
        long = asyncio.create_task(_timed(http, _body(200), done, "long"))
        while cluster.stats("decode-0").load.running == 0:  # the slot is taken
            await asyncio.sleep(0.05)
        batch = []
        for i in range(10):
            batch.append(asyncio.create_task(_timed(http, _body(4, 5), done, f"p5-{i}")))
            await asyncio.sleep(0.05)  # arrival order is submission order
        await asyncio.sleep(0.5)  # every priority-5 request is queued before the urgent one
        urgent = asyncio.create_task(_timed(http, _body(4, 0), done, "p0"))
        codes = await asyncio.gather(long, *batch, urgent)
    return done, codes


def test_a_priority_0_request_overtakes_ten_priority_5_ones(cluster: Cluster) -> None:
    done, codes = asyncio.run(_priorities(cluster))
    assert codes == [200] * 12
    assert done[:2] == ["long", "p0"], done


async def _one_stream(http: httpx.AsyncClient) -> tuple[int, bool]:
    """(status, whether any token came before an error)."""
    async with http.stream("POST", "/v1/completions", json=_body(24, stream=True)) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return resp.status_code, False
        events = [ln[6:] async for ln in resp.aiter_lines() if ln.startswith("data: ")]
    payloads = [json.loads(e) for e in events if e != "[DONE]"]
    assert events[-1] == "[DONE]" and not [p for p in payloads if "error" in p], payloads[-1:]
    return 200, True


async def _flood(cluster: Cluster, n: int) -> list[tuple[int, bool]]:
    async with httpx.AsyncClient(base_url=cluster.base_url, timeout=180, trust_env=False) as http:
        return await asyncio.gather(*(_one_stream(http) for _ in range(n)))


def test_a_flood_queues_or_gets_429_and_leaves_nothing_behind(cluster: Cluster) -> None:
    before = {n: cluster.stats(n).load for n in ("prefill-0", "decode-0")}
    started = time.monotonic()
    results = asyncio.run(_flood(cluster, 12))
    assert all(code in (200, 429) for code, _ in results), results
    assert sum(code == 200 for code, _ in results) >= 1
    assert time.monotonic() - started < 170
    idle = cluster.wait_idle(["prefill-0", "decode-0"])
    for name, stats in idle.items():
        assert stats.load.free_blocks == before[name].free_blocks == stats.load.total_blocks
        assert stats.load.leases_held == 0 and stats.load.running == 0, name
