"""A flood of streamed chat requests on `splitserve up --prefill 1 --decode 2` made small on
purpose: every request gets a complete stream or a 429 before any work, never a stream that
fails after its first token, and afterwards every KV block is free and no lease is held.

The decode nodes run 2 requests each (--max-num-seqs 2), have few KV blocks and keep a KV
import waiting 1 s at most (SPLITSERVE_IMPORT_WAIT_S) before they answer 503, so a decode
pool too busy for the prefilled requests shows within seconds. The router admits what the
pools report they hold (the prefill node's batch of 2, each decode node's 2 running and 2
queued: 10), and its queue holds 24 more (SPLITSERVE_MAX_QUEUED): the rest get 429 with
Retry-After."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
from cluster_harness import Cluster, running_cluster

pytestmark = pytest.mark.e2e

FLOOD = 60
MAX_TOKENS = 24
# With the chat template's system prompt, over local_prefill_max_tokens (32): a remote prefill.
QUESTION = "Write a short story about a lighthouse keeper who finds a message in a bottle."
NODES = ("prefill-0", "decode-0", "decode-1")


@pytest.fixture(scope="module")
def cluster(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    run_dir = tmp_path_factory.mktemp("up-flood")
    args = ("--prefill", "1", "--decode", "2", "--max-num-seqs", "2", "--num-kv-blocks", "24")
    env = {"SPLITSERVE_IMPORT_WAIT_S": "1", "SPLITSERVE_MAX_QUEUED": "24"}
    with running_cluster(default_model_dir, run_dir, *args, check_clean_exit=True, env=env) as up:
        yield up


class Outcome(NamedTuple):
    status: int
    retry_after: str | None
    tokens: int  # completion tokens of a complete stream
    errors: list[Any]  # error events inside the stream


async def _one_stream(http: httpx.AsyncClient, i: int) -> Outcome:
    body = {
        "model": "smollm2", "messages": [{"role": "user", "content": f"{QUESTION} ({i})"}],
        "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return Outcome(resp.status_code, resp.headers.get("retry-after"), 0, [])
        events = [ln[6:] async for ln in resp.aiter_lines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    payloads = [json.loads(e) for e in events[:-1]]
    usage = [p["usage"] for p in payloads if p.get("usage")]
    tokens = usage[-1]["completion_tokens"] if usage else 0
    return Outcome(200, None, tokens, [p["error"] for p in payloads if "error" in p])


async def _flood(cluster: Cluster, n: int) -> list[Outcome]:
    limits = httpx.Limits(max_connections=None)
    async with httpx.AsyncClient(
        base_url=cluster.base_url, timeout=120, trust_env=False, limits=limits
    ) as http:
        return await asyncio.gather(*(_one_stream(http, i) for i in range(n)))


def _admission_limit(cluster: Cluster) -> float:
    text = httpx.get(cluster.base_url + "/metrics", timeout=5, trust_env=False).text
    (line,) = [ln for ln in text.splitlines() if ln.startswith("splitserve_router_admission_limit")]
    return float(line.rsplit(" ", 1)[1])


def test_a_flood_gets_complete_streams_or_429_before_any_work(cluster: Cluster) -> None:
    outcomes = asyncio.run(_flood(cluster, FLOOD))
    served = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status != 200]
    assert [o.errors for o in served if o.errors] == []  # no stream failed after token 1
    assert all(o.tokens == MAX_TOKENS for o in served), [o.tokens for o in served]
    assert {(o.status, o.retry_after) for o in refused} <= {(429, "1")}
    assert served and refused
    assert _admission_limit(cluster) == 2 + 2 * (2 + 2)
    idle = cluster.wait_idle(list(NODES), timeout_s=30)
    for name, stats in idle.items():
        load = stats.load
        assert load.free_blocks == load.total_blocks, name
        assert load.leases_held == 0 and load.running == 0 and load.waiting == 0, name
