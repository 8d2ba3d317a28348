"""`splitserve up` (1 prefill + 1 decode) as an operator meets it: it shows each node's
start-up phases and how to read /stats; node endpoints (/stats included) and the KV handshake
refuse callers without the run's cluster token (the probes stay open), and the embedded Redis
SIGKILLed twice under 16 concurrent streams comes back on its port while every stream
completes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cluster_harness import Cluster, running_cluster

from cluster.auth import CLUSTER_TOKEN_HEADER
from cluster.node_records import NodeStats
from cluster.version import build_info
from kv_transfer import PeerInfo
from kv_transfer.tcp_protocol import Kind, recv_json, send_json

pytestmark = pytest.mark.e2e

NUM_STREAMS = 16
PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"


@pytest.fixture(scope="module")
def cluster(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    run_dir = tmp_path_factory.mktemp("up-ops")
    # TCP transport: its HELLO carries the token (NIXL's UCX connections have no such step)
    args = ("--num-kv-blocks", "256", "--max-num-seqs", "16", "--transfer", "tcp")
    with running_cluster(default_model_dir, run_dir, *args, check_clean_exit=True) as up:
        yield up


@pytest.mark.parametrize("headers", [{}, {CLUSTER_TOKEN_HEADER: "a-wrong-token-0123456789"}])
def test_node_endpoints_need_the_cluster_token(cluster: Cluster, headers: dict[str, str]) -> None:
    body = {"request_id": "x", "prompt_token_ids": [1, 2, 3], "sampling": {"max_tokens": 2}}
    calls = [
        ("prefill-0", "/internal/prefill", body),
        ("prefill-0", "/internal/release", {"request_id": "x"}),
        ("decode-0", "/internal/generate", body | {"output_token_ids": []}),
        ("decode-0", "/internal/abort", {"request_id": "x"}),
    ]
    with httpx.Client(timeout=10, trust_env=False) as http:
        for node, path, payload in calls:
            resp = http.post(cluster.node_url(node) + path, json=payload, headers=headers)
            assert resp.status_code == 401, (node, path, resp.text)
            assert resp.json()["error"]["code"] == "unauthorized"
        for node in ("prefill-0", "decode-0"):  # /stats shows transfer metadata: guarded too
            resp = http.get(cluster.node_url(node) + "/stats", headers=headers)
            assert resp.status_code == 401 and "peer_info" not in resp.text, (node, resp.text)
            for probe in ("/health", "/ready"):
                assert http.get(cluster.node_url(node) + probe).status_code == 200, (node, probe)
    assert cluster.stats("prefill-0").counters.get("requests_total", 0) == 0


def test_up_shows_each_node_start_and_how_to_read_stats(cluster: Cluster) -> None:
    """While it starts, `up` shows each node's phases with their times; once up, the printed
    stats command reads /stats (with the cluster token's header file), and every process
    answers /version."""
    out = cluster.output()
    for node in ("prefill-0", "decode-0"):
        for phase in ("kernels", "weights", "kv_cache", "transfer"):
            assert re.search(rf"^  {node}: {phase} [0-9.]+s$", out, re.M), (node, phase, out)
        assert re.search(rf"^  {node}: ready after [0-9.]+s$", out, re.M), (node, out)
    assert out.index("ready after") < out.index("splitserve is up")
    command = next(line for line in out.splitlines() if "stats: " in line).split("stats: ")[1]
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30)
    assert NodeStats.model_validate_json(done.stdout).info.node_id == "prefill-0", done.stderr
    with httpx.Client(timeout=10, trust_env=False) as http:
        urls = [cluster.base_url] + [cluster.node_url(n) for n in ("prefill-0", "decode-0")]
        versions = [http.get(url + "/version").json()["version"] for url in urls]
    assert versions == [build_info()["version"]] * 3


def test_the_kv_handshake_refuses_a_reader_without_the_token(cluster: Cluster) -> None:
    info = cluster.stats("prefill-0").info
    peer = PeerInfo.from_json(info.peer_info)
    assert peer.tcp_host is not None and peer.tcp_port is not None
    hello = {"agent": "intruder.0", "fingerprint": peer.fingerprint, "layout": peer.layout}
    for token in (None, "a-wrong-token-0123456789"):
        with socket.create_connection((peer.tcp_host, peer.tcp_port), timeout=10) as sock:
            send_json(sock, Kind.HELLO, hello | {"expect": peer.incarnation, "token": token})
            kind, answer = recv_json(sock)
        assert kind is Kind.ERROR and answer["code"] == "unauthorized"


def _redis_pid(cluster: Cluster) -> int:
    return int(json.loads((cluster.run_dir / "cluster.json").read_text())["pids"]["redis"])


def _kill_redis_and_wait_for_restart(cluster: Cluster) -> None:
    old = _redis_pid(cluster)
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while _redis_pid(cluster) == old:
        assert time.monotonic() < deadline, "the launcher did not restart Redis"
        time.sleep(0.05)


async def _stream(http: httpx.AsyncClient, model: str, started: asyncio.Event) -> list[str]:
    body = {
        "model": model, "prompt": PROMPT, "max_tokens": 64, "temperature": 0, "stream": True,
        "ignore_eos": True,
    }  # fmt: skip
    events = []
    async with http.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
                started.set()
    return events


async def _streams_through_two_redis_kills(cluster: Cluster) -> list[list[str]]:
    async with httpx.AsyncClient(base_url=cluster.base_url, timeout=120, trust_env=False) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]
        flags = [asyncio.Event() for _ in range(NUM_STREAMS)]
        tasks = [asyncio.create_task(_stream(http, model, flag)) for flag in flags]
        await asyncio.wait_for(asyncio.gather(*(f.wait() for f in flags)), 120)
        for _ in range(2):
            await asyncio.to_thread(_kill_redis_and_wait_for_restart, cluster)
        assert not all(t.done() for t in tasks), "the streams ended before the second kill"
        results = await asyncio.gather(*tasks)
    # the cluster keeps serving: a new request after the restarts completes (on a new
    # connection: a pooled one may meet the router's keep-alive timeout)
    async with httpx.AsyncClient(base_url=cluster.base_url, timeout=120, trust_env=False) as http:
        after = await _stream(http, model, asyncio.Event())
    return [*results, after]


def test_embedded_redis_killed_twice_under_load(cluster: Cluster) -> None:
    results = asyncio.run(_streams_through_two_redis_kills(cluster))
    for events in results:
        assert events[-1] == "[DONE]"
        payloads = [json.loads(e) for e in events[:-1]]
        assert not [p for p in payloads if "error" in p]
        text = "".join(p["choices"][0]["text"] for p in payloads if p.get("choices"))
        assert text and payloads[-1]["choices"][0]["finish_reason"] == "length"
    assert cluster.output().count("redis_restarted") == 2
    idle = cluster.wait_idle(["prefill-0", "decode-0"])
    for name, stats in idle.items():
        assert stats.load.free_blocks == stats.load.total_blocks, name
        assert stats.load.leases_held == 0, name
