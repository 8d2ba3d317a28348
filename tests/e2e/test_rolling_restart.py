"""A rolling restart of a 2 + 2 `splitserve up` cluster under steady load loses no request.

Each node in turn gets SIGTERM (it drains: leaves the registry, refuses new work, finishes
or hands over what runs within SPLITSERVE_DRAIN_TIMEOUT_S) and is started again with the
same command line and environment once it has exited. Streams still running on a decode
node at its drain deadline resume on the other decode node. Every request of the load must
complete normally."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cluster_harness import Cluster, alive, running_cluster

from cluster.listen import LISTEN_FD_ENV

pytestmark = pytest.mark.e2e

DRAIN_S = "1"
WORKERS = 4
PROMPT = "The old lighthouse keeper climbed the stairs every evening, and on the last night he"
NODES = ["prefill-0", "prefill-1", "decode-0", "decode-1"]


@pytest.fixture(scope="module")
def cluster(
    default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch_module: None
) -> Iterator[Cluster]:
    run_dir = tmp_path_factory.mktemp("rolling")
    args = ("--prefill", "2", "--decode", "2", "--num-kv-blocks", "256")
    with running_cluster(default_model_dir, run_dir, *args) as up:
        yield up


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[None]:
    """The launcher's children inherit a short drain timeout."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPLITSERVE_DRAIN_TIMEOUT_S", DRAIN_S)
        yield


class Load:
    """WORKERS clients streaming completions back to back until stopped."""

    def __init__(self, http: httpx.AsyncClient, model: str) -> None:
        self.http, self.model = http, model
        self.done = 0
        self.failures: list[str] = []
        self.stop = asyncio.Event()

    async def worker(self, index: int) -> None:
        turn = 0
        while not self.stop.is_set():
            max_tokens = 96 if (index + turn) % 2 else 16
            turn += 1
            try:
                problem = await self._one(max_tokens)
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if problem:
                self.failures.append(problem)
            else:
                self.done += 1

    async def _one(self, max_tokens: int) -> str | None:
        body = {
            "model": self.model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "ignore_eos": True,
        }  # fmt: skip
        events = []
        async with self.http.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                return f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
        if not events or events[-1] != "[DONE]":
            return "stream without [DONE]"
        payloads = [json.loads(e) for e in events[:-1]]
        errors = [p["error"] for p in payloads if "error" in p]
        if errors:
            return f"error event: {errors[0]}"
        if payloads[-1]["choices"][0]["finish_reason"] != "length":
            return f"unexpected end: {payloads[-1]}"
        return None


def _restart(cluster: Cluster, name: str, pid: int) -> subprocess.Popen[bytes]:
    """SIGTERM `pid`, wait for it to exit, start the same command with the same env (less
    the socket hand-off: the new process binds the port itself)."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    raw_env = Path(f"/proc/{pid}/environ").read_bytes().rstrip(b"\0").split(b"\0")
    env = dict(item.decode().split("=", 1) for item in raw_env)
    env.pop(LISTEN_FD_ENV, None)  # the launcher's socket went with the old process: bind anew
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while alive(pid):
        assert time.monotonic() < deadline, f"{name} did not exit after SIGTERM"
        time.sleep(0.05)
    log = open(cluster.run_dir / f"{name}.restarted.log", "ab")  # noqa: SIM115
    return subprocess.Popen(
        [a.decode() for a in argv], env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def _wait_back(cluster: Cluster, name: str) -> None:
    """Until the restarted node is ready and the router knows all four nodes again."""
    deadline = time.monotonic() + 180
    with httpx.Client(timeout=5, trust_env=False) as http:
        while True:
            try:
                node_ok = http.get(cluster.node_url(name) + "/ready").status_code == 200
                body = http.get(cluster.base_url + "/ready").json()
            except httpx.HTTPError:
                node_ok, body = False, {}
            if node_ok and body.get("prefill_nodes") == 2 and body.get("decode_nodes") == 2:
                return
            assert time.monotonic() < deadline, f"{name} did not come back"
            time.sleep(0.2)


async def _roll(cluster: Cluster, started: list[subprocess.Popen[bytes]]) -> Load:
    async with httpx.AsyncClient(base_url=cluster.base_url, timeout=120, trust_env=False) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]
        load = Load(http, model)
        workers = [asyncio.create_task(load.worker(i)) for i in range(WORKERS)]
        for name in NODES:
            before = load.done
            while load.done < before + 1:  # steady load reached the cluster again
                await asyncio.sleep(0.1)
            pid = cluster.pids[name]
            started.append(await asyncio.to_thread(_restart, cluster, name, pid))
            await asyncio.to_thread(_wait_back, cluster, name)
        load.stop.set()
        await asyncio.wait_for(asyncio.gather(*workers), 180)
        return load


def test_rolling_restart_under_load_loses_no_request(cluster: Cluster) -> None:
    started: list[subprocess.Popen[bytes]] = []
    try:
        load = asyncio.run(_roll(cluster, started))
    finally:
        for proc in started:
            proc.send_signal(signal.SIGTERM)
        for proc in started:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert load.failures == []
    assert load.done >= 2 * len(NODES)
    for line in ("node_draining", "node_deregistered"):
        for name in NODES:
            assert line in (cluster.run_dir / f"{name}.log").read_text(), (name, line)
