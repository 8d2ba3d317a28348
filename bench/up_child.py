"""`splitserve up` as a child of a benchmark: started with the run's cluster token (so the
nodes' /stats answer this process), ready once it says so, its nodes' /stats and the router's
/metrics read, stopped with SIGINT. It dies with the benchmark (PR_SET_PDEATHSIG): a benchmark
killed at its deadline leaves no cluster behind (the launcher stops its own children)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from cluster.auth import cluster_headers, new_token
from cluster.settings import CLUSTER_TOKEN_ENV
from config_kit import Secret
from launcher.process import die_with_parent_hook

UP_TIMEOUT_S = 300.0
READY_LINE = "splitserve is up"


class UpChild:
    """One `splitserve up ARGS --port 0 --run-dir RUN_DIR`; returns once it is up (RuntimeError
    with the end of its output when it exits or is not up within ``timeout_s``)."""

    def __init__(self, up_args: Sequence[str], run_dir: Path, timeout_s: float = UP_TIMEOUT_S):
        self.run_dir = run_dir
        argv = [sys.executable, "-m", "launcher.cli", "up", *up_args]
        argv += ["--port", "0", "--run-dir", str(run_dir)]
        run_dir.mkdir(parents=True, exist_ok=True)
        self.token = os.environ.get(CLUSTER_TOKEN_ENV) or new_token()
        env = dict(os.environ, **{CLUSTER_TOKEN_ENV: self.token})
        started = time.monotonic()
        with open(run_dir / "launcher.out", "wb") as sink:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                start_new_session=True, env=env, preexec_fn=die_with_parent_hook(),
            )  # fmt: skip
        deadline = started + timeout_s
        while READY_LINE not in self.output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"splitserve up did not come up:\n{self.output()[-3000:]}")
            time.sleep(0.2)
        self.start_s = time.monotonic() - started
        self.layout: dict[str, Any] = json.loads((run_dir / "cluster.json").read_text())

    @property
    def url(self) -> str:
        return str(self.layout["router"])

    def node_urls(self, role: str) -> dict[str, str]:
        """Name -> URL of the nodes of ``role``."""
        nodes = self.layout["nodes"].items()
        return {name: str(node["url"]) for name, node in nodes if node["role"] == role}

    def stats(self, node_url: str) -> dict[str, Any]:
        """A node's /stats (cluster.protocol.NodeStats as JSON)."""
        headers = cluster_headers(Secret(self.token))
        resp = httpx.get(node_url + "/stats", headers=headers, timeout=10, trust_env=False)
        resp.raise_for_status()
        stats: dict[str, Any] = resp.json()
        return stats

    def router_samples(self) -> Iterator[Sample]:
        """Every sample of the router's /metrics."""
        text = httpx.get(self.url + "/metrics", timeout=10, trust_env=False).text
        for family in text_string_to_metric_families(text):
            yield from family.samples

    def stop(self) -> None:
        """Ctrl-C the launcher (it stops its children); SIGKILL its group after 60 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def output(self) -> str:
        path = self.run_dir / "launcher.out"
        return path.read_text(errors="replace") if path.exists() else ""
