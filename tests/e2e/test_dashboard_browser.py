"""The dashboard in a real headless browser (Debian's `chromium`) over a live `splitserve up`
(1 prefill + 2 decode): the page loads, draws its charts (with axes and a legend; the pools'
nodes stacked, never one line over the other) and latency figures from the traffic it sees,
lists every node and the routes requested, and a node that drains away leaves its table."""

from __future__ import annotations

import os
import re
import signal
import threading
from pathlib import Path

import httpx
import pytest
from cluster_harness import Cluster, running_cluster
from headless_browser import Browser, Page, find_browser

pytestmark = pytest.mark.e2e

PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who " * 4
LIVE = """(() => {
  const charts = [...document.querySelectorAll("svg.chart")];
  const status = document.getElementById("status");  // null while the page loads
  return !!status && status.dataset.state === "ok"
    && parseFloat(document.getElementById("rps").textContent) > 0
    && /ms|s/.test(document.getElementById("ttft").textContent)
    && !document.getElementById("ttft").textContent.includes("–")
    && charts.length === 4 && charts.every((c) => Number(c.dataset.points) >= 3);
})()"""

# per chart: y tick labels, x tick labels, legend entries
AXES = """[...document.querySelectorAll("svg.chart")].map((c) => [
  c.querySelectorAll("text.tick.y").length, c.querySelectorAll("text.tick.x").length,
  c.closest("figure").querySelectorAll(".legend li").length])"""
# the highest point (smallest y) of the prefill band and of the decode band stacked on it
BAND_TOPS = """["a0", "a1"].map((band) => Math.min(...document
  .querySelector(`#chart-nodes polygon.${band}`).getAttribute("points").split(" ")
  .map((xy) => Number(xy.split(",")[1]))))"""
# the transfer panel: a row per (prefill node read from, decode node) with a bandwidth
PAIR_ROW = (
    "[...document.querySelectorAll('#transfers tr[data-pair^=\"prefill-0>decode-\"]')]"
    ".some((r) => /GB\\/s/.test(r.textContent))"
)


def _text(page: Page, element: str) -> str:
    return str(page.evaluate(f"document.getElementById({element!r}).textContent"))


def _nodes(page: Page) -> list[str]:
    rows = page.evaluate('[...document.querySelectorAll("tr[data-node]")].map(r => r.dataset.node)')
    return sorted(rows)


def _traffic(cluster: Cluster, model: str, stop: threading.Event) -> None:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 8}
    with httpx.Client(base_url=cluster.base_url, timeout=120, trust_env=False) as http:
        while not stop.is_set():
            assert http.post("/v1/completions", json=body).status_code == 200


def test_the_dashboard_draws_live_figures_and_loses_a_drained_node(
    default_model_dir: Path, tmp_path: Path
) -> None:
    binary = find_browser()
    if binary is None:
        pytest.skip(
            "no headless browser: install Debian's `chromium` package (.ci/run does) or set "
            "SPLITSERVE_CHROMIUM to a Chrome / Chromium binary"
        )
    args = ("--decode", "2", "--num-kv-blocks", "256", "--transfer", "tcp")
    with (
        running_cluster(default_model_dir, tmp_path / "up", *args, check_clean_exit=True) as up,
        Browser(binary, tmp_path / "profile") as browser,
    ):
        stop = threading.Event()
        load = threading.Thread(target=_traffic, args=(up, default_model_dir.name, stop))
        load.start()
        try:
            page = browser.open(up.base_url + "/dashboard")
            page.wait_for(LIVE, 90, "live figures and four drawn charts")
            page.wait_for(PAIR_ROW, 60, "a KV transfer row for prefill-0 and a decode node")
            page.screenshot(tmp_path / "dashboard.png")
        finally:
            stop.set()
            load.join(timeout=120)
        assert _nodes(page) == ["decode-0", "decode-1", "prefill-0"]
        assert re.fullmatch(r"([\d.]+ m?s / ){2}[\d.]+ m?s", _text(page, "ttft"))
        assert page.evaluate('document.getElementById("planner").hidden')  # no planner runs
        assert all(y >= 2 and x >= 2 and legend >= 2 for y, x, legend in page.evaluate(AXES))
        prefill_top, decode_top = page.evaluate(BAND_TOPS)
        assert decode_top < prefill_top  # 1 prefill node, then 2 decode nodes above it
        assert (tmp_path / "dashboard.png").stat().st_size > 10_000
        routes = '[...document.querySelectorAll("tr[data-route]")].map(r => r.dataset.route)'
        assert "/v1/completions" in page.evaluate(routes)  # the traffic, counted by route

        os.kill(up.pids["decode-1"], signal.SIGTERM)  # it drains and leaves the registry
        gone = "!document.querySelector('tr[data-node=\"decode-1\"]')"
        page.wait_for(gone, 60, "decode-1 leaving the node table")
        assert _nodes(page) == ["decode-0", "prefill-0"]
