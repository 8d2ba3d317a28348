"""`splitserve up --planner --prefill 1 --decode 1` on the default model: a burst of long
prompts pushes TTFT past its target and the planner adds a prefill node that joins and
serves; once the burst is over it drains that node away. No request fails meanwhile."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from cluster_harness import Cluster, running_cluster
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.e2e

PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who " * 12
PLANNER_ARGS = (
    "--planner", "--ttft-slo-ms", "300", "--planner-interval-s", "1",
    "--planner-cooldown-s", "10", "--max-prefill", "2", "--max-decode", "1",
    "--num-kv-blocks", "256", "--transfer", "tcp",
)  # fmt: skip


def _wait(condition: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f}s: {what}"
        time.sleep(0.5)


def _prefill_nodes(cluster: Cluster) -> int:
    body = httpx.get(cluster.base_url + "/ready", timeout=5, trust_env=False).json()
    return int(body["prefill_nodes"])


def _decisions(cluster: Cluster) -> dict[str, float]:
    text = httpx.get(cluster.layout["planner"] + "/metrics", timeout=5, trust_env=False).text
    return {
        s.labels["direction"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "splitserve_planner_decisions_total" and s.labels["pool"] == "prefill"
    }


def _burst(cluster: Cluster, model: str, stop: threading.Event) -> list[int]:
    """Requests 10 per second from 8 clients until `stop`; their status codes."""

    def one(i: int) -> int:
        body = {"model": model, "prompt": f"{PROMPT}{i}", "max_tokens": 4}
        resp = httpx.post(
            cluster.base_url + "/v1/completions", json=body, timeout=180, trust_env=False
        )
        return resp.status_code

    futures: list[Future[int]] = []
    with ThreadPoolExecutor(8) as pool:
        while not stop.is_set():
            futures.append(pool.submit(one, len(futures)))
            stop.wait(0.1)
    return [f.result() for f in futures]


def test_a_burst_adds_a_prefill_node_and_idling_drains_it(
    default_model_dir: Path, tmp_path: Path
) -> None:
    with running_cluster(default_model_dir, tmp_path, *PLANNER_ARGS, check_clean_exit=True) as up:
        stop = threading.Event()
        codes: list[int] = []
        load = threading.Thread(
            target=lambda: codes.extend(_burst(up, default_model_dir.name, stop))
        )
        load.start()
        try:
            _wait(lambda: "planner: started prefill-1" in up.output(), "scale-up", 120)
            _wait(lambda: _prefill_nodes(up) == 2, "prefill-1 in the registry", 240)
        finally:
            stop.set()
            load.join(timeout=300)
        assert codes and set(codes) == {200}, f"{len(codes)} requests: {sorted(set(codes))}"
        _wait(lambda: "prefill-1 drained" in up.output(), "drain after the burst", 240)
        # the router drops it at its next membership poll
        _wait(lambda: _prefill_nodes(up) == 1, "prefill-1 out of the router's membership", 30)
        assert _decisions(up).get("up", 0) >= 1 and _decisions(up).get("down", 0) >= 1
        assert "planner: draining prefill-1 (load_fell)" in up.output()
