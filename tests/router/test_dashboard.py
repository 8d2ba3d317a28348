"""The dashboard's files and the snapshot its page polls, over fake nodes: every node with
its load and counters, the router's histograms, requests per route, no planner without one."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from router_fakes import FakeNode, fake_cluster

from models.tokenizer import Tokenizer
from router.dashboard.data import transfer_pairs

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Capital of France?"}]}
pytestmark = pytest.mark.timeout(60)


async def test_the_page_its_files_and_the_snapshot(tokenizer: Tokenizer, script: list[int]) -> None:
    nodes = [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]
    async with (
        fake_cluster(tokenizer, nodes) as c,
        httpx.AsyncClient(base_url=c.router_url) as client,
    ):
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert (await client.post("/v1/completions", json={"model": "smollm2"})).status_code == 400
        page = await client.get("/dashboard")
        js = await client.get("/dashboard/static/dashboard.js")
        missing = [await client.get(f"/dashboard/static/{n}") for n in ("nope.js", "..%2Fx.js")]
        data = (await client.get("/dashboard/data")).json()
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "/dashboard/static/dashboard.js" in page.text
    assert js.status_code == 200 and "text/javascript" in js.headers["content-type"]
    assert [m.status_code for m in missing] == [404, 404]
    assert [n["id"] for n in data["nodes"]] == ["d0", "p0"]
    assert {n["role"] for n in data["nodes"]} == {"prefill", "decode"}
    assert data["router"]["requests"] == 1 and data["router"]["completion_tokens"] > 0
    assert data["routes"] == {  # requests per route, the dashboard's own polls left out
        "/v1/chat/completions": {"requests": 1, "errors": 0},
        "/v1/completions": {"requests": 1, "errors": 1},
        "other": {"requests": 1, "errors": 1},  # the path no route takes (..%2Fx.js)
    }
    ttft = data["histograms"]["ttft"]
    assert ttft[-1][0] == 1e308 and ttft[-1][1] == 1  # cumulative, +Inf last
    assert data["planner"] is None


def test_transfer_pairs_from_a_reading_nodes_metrics() -> None:
    """Per (transport, peer read from): completed READs, their windows and bytes."""
    text = "".join(
        f'splitserve_kv_transfer_{name}{{role="decode",node="d0",transport="tcp",'
        f'peer="{peer}"}} {value}\n'
        for peer, reads, window, nbytes in (("p1", 2, 0.5, 4e8), ("p0", 3, 0.25, 3e8))
        for name, value in (("window_seconds_count", reads), ("window_seconds_sum", window),
                            ("size_bytes_sum", nbytes), ("size_bytes_count", reads))
    )  # fmt: skip
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    assert transfer_pairs(samples) == [
        {"transport": "tcp", "peer": "p0", "reads": 3.0, "window_s": 0.25, "bytes": 3e8},
        {"transport": "tcp", "peer": "p1", "reads": 2.0, "window_s": 0.5, "bytes": 4e8},
    ]
