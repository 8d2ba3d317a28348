"""`splitserve up` as a child of the test: start, read its cluster.json, stop with SIGINT, and
check that every process it started is gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai

from cluster.auth import CLUSTER_TOKEN_HEADER
from cluster.node_records import NodeStats
from cluster.settings import CLUSTER_TOKEN_ENV

UP_TIMEOUT_S = 240.0
# the clusters' token (the launcher keeps one it finds in its environment): /stats needs it
CLUSTER_TOKEN = "e2e-cluster-token-0123456789abcdef"


@dataclass
class Cluster:
    """A running `splitserve up`; `layout` is its cluster.json."""

    proc: subprocess.Popen[bytes]
    run_dir: Path
    layout: dict[str, Any]

    @property
    def base_url(self) -> str:
        return str(self.layout["router"])

    @property
    def pids(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.layout["pids"].items()}

    def node_url(self, name: str) -> str:
        return str(self.layout["nodes"][name]["url"])

    def node_names(self, role: str) -> list[str]:
        return [n for n, v in self.layout["nodes"].items() if v["role"] == role]

    def stats(self, name: str) -> NodeStats:
        headers = {CLUSTER_TOKEN_HEADER: CLUSTER_TOKEN}
        resp = httpx.get(
            self.node_url(name) + "/stats", headers=headers, timeout=5, trust_env=False
        )
        resp.raise_for_status()
        return NodeStats.model_validate_json(resp.content)

    def openai_client(self, timeout_s: float = 120) -> openai.OpenAI:
        """The official client on the router, without retries (a failure shows at once)."""
        return openai.OpenAI(
            base_url=self.base_url + "/v1", api_key="unused", max_retries=0, timeout=timeout_s
        )

    def output(self) -> str:
        return (self.run_dir / "launcher.out").read_text(errors="replace")

    def wait_idle(self, names: list[str], timeout_s: float = 15.0) -> dict[str, NodeStats]:
        """Stats of `names` once each holds no request, no block and no lease."""
        deadline = time.monotonic() + timeout_s
        while True:
            now = {n: self.stats(n) for n in names}
            if all(_idle(s) for s in now.values()) or time.monotonic() > deadline:
                return now
            time.sleep(0.1)

    def stop(self, timeout_s: float = 40.0) -> int:
        """Ctrl-C the launcher; its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise


def _idle(stats: NodeStats) -> bool:
    load = stats.load
    return (
        load.running == 0
        and load.waiting == 0
        and load.leases_held == 0
        and load.free_blocks == load.total_blocks
    )


def start_cluster(
    model_dir: Path, run_dir: Path, *args: str, env: dict[str, str] | None = None
) -> Cluster:
    """`splitserve up` on the CPU in float32 (the oracle's settings), 1 torch thread per node;
    returns once it reports ready. `env`: more environment for every process (settings
    `up` has no flag for, SPLITSERVE_<FIELD>)."""
    argv = [sys.executable, "-m", "launcher.cli", "up", "--model", str(model_dir)]
    # port 0: the launcher binds one and writes the router's URL in cluster.json
    argv += ["--port", "0", "--device", "cpu", "--dtype", "float32"]
    argv += ["--threads-per-node", "1", "--run-dir", str(run_dir), *args]
    run_dir.mkdir(parents=True, exist_ok=True)
    out = run_dir / "launcher.out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            argv,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(os.environ, **(env or {}), **{CLUSTER_TOKEN_ENV: CLUSTER_TOKEN}),
        )
    cluster = Cluster(proc, run_dir, {})
    deadline = time.monotonic() + UP_TIMEOUT_S
    while "splitserve is up" not in cluster.output():
        if proc.poll() is not None or time.monotonic() > deadline:
            cluster.stop()
            raise RuntimeError(f"splitserve up did not come up:\n{cluster.output()[-3000:]}")
        time.sleep(0.2)
    cluster.layout = json.loads((run_dir / "cluster.json").read_text())
    return cluster


@contextmanager
def running_cluster(
    model_dir: Path,
    run_dir: Path,
    *args: str,
    check_clean_exit: bool = False,
    env: dict[str, str] | None = None,
) -> Iterator[Cluster]:
    """`start_cluster`, then stop it; any process of ours still alive is SIGKILLed.

    With `check_clean_exit`, the launcher must exit 0 and leave no process behind (checked
    after the stragglers are killed, so a failure never leaks them into later tests).
    """
    up = start_cluster(model_dir, run_dir, *args, env=env)
    try:
        yield up
    finally:
        code = up.stop()
        stragglers = [name for name, pid in up.pids.items() if alive(pid)]
        for name in stragglers:
            os.kill(up.pids[name], signal.SIGKILL)
        if check_clean_exit:
            assert code == 0, f"splitserve up exited {code}"
            assert stragglers == [], f"still running after stop: {stragglers}"


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
