"""Both metrics sources answer the samples the planner reads, or None when they cannot be
read: the router's and nodes' /metrics (a node going away is left out), or Prometheus."""

from __future__ import annotations

import httpx
from prometheus_client import CollectorRegistry, Counter, generate_latest

from cluster.node_records import NodeInfo, NodeRecord
from planner.observation import PROMPT_TOKENS, TTFT_BUCKETS
from planner.sources import DirectSource, PrometheusSource
from router.metrics import RouterMetrics


def _node(node_id: str, role: str = "prefill") -> NodeRecord:
    info = NodeInfo(
        node_id=node_id, role=role, url=f"http://{node_id}:1", model="m", layout_fingerprint="f",
        max_model_len=64, capacity=8, started_at=0.0,
    )  # fmt: skip
    return NodeRecord(info=info, heartbeat_at=1.0)


def _node_metrics(node_id: str, tokens: float) -> bytes:
    registry = CollectorRegistry()
    c = Counter("splitserve_prompt_tokens", "x", ["role", "node"], registry=registry)
    c.labels("prefill", node_id).inc(tokens)
    return generate_latest(registry)


async def test_direct_reads_the_router_and_every_node_that_answers() -> None:
    router = RouterMetrics("r0")
    router.ttft.observe(0.3)

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.host == "router":
            return httpx.Response(200, content=router.render()[0])
        if request.url.host == "p0":
            return httpx.Response(200, content=_node_metrics("p0", 123))
        return httpx.Response(503)  # p1 is draining

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        source = DirectSource(["http://router:8000/"], http)
        samples = await source.read([_node("p0"), _node("p1")])
    assert samples is not None
    tokens = {s.labels["node"]: s.value for s in samples if s.name == PROMPT_TOKENS}
    assert tokens == {"p0": 123.0}
    buckets = [s for s in samples if s.name == TTFT_BUCKETS]
    assert buckets and max(s.value for s in buckets) == 1.0


async def test_direct_without_its_router_is_unreachable() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(down)) as http:
        assert await DirectSource(["http://router:8000"], http).read([_node("p0")]) is None


async def test_prometheus_answers_the_same_samples_or_none() -> None:
    result = [
        {"metric": {"__name__": PROMPT_TOKENS, "node": "p0", "role": "prefill"},
         "value": [1.0, "42"]},
    ]  # fmt: skip
    answers = iter(
        [
            httpx.Response(200, json={"status": "success", "data": {"result": result}}),
            httpx.Response(200, json={"status": "error", "error": "bad query"}),
            httpx.Response(502, text="bad gateway"),
        ]
    )
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.params["query"])
        return next(answers)

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        source = PrometheusSource("http://prom:9090/", http)
        samples = await source.read([])
        assert samples is not None and samples[0].value == 42.0
        assert samples[0].labels == {"node": "p0", "role": "prefill"}
        assert await source.read([]) is None
        assert await source.read([]) is None
    assert PROMPT_TOKENS in seen[0] and TTFT_BUCKETS in seen[0]
