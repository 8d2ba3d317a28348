"""Where the planner reads the cluster's metrics: straight from the router's and the nodes'
GET /metrics, or from a Prometheus server that scrapes them. Either answers the same
`Sample`s, or None when it cannot be read (the planner then holds its decision)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import httpx
from prometheus_client.parser import text_string_to_metric_families

from cluster.node_records import NodeRecord
from planner.observation import READS, Sample

log = logging.getLogger("splitserve.planner")
METRICS = "/metrics"


class Source(Protocol):
    async def read(self, nodes: Sequence[NodeRecord]) -> tuple[Sample, ...] | None: ...


def parse_exposition(text: str) -> list[Sample]:
    """The samples the planner reads from one Prometheus text exposition."""
    return [
        Sample(s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in READS
    ]


class DirectSource:
    """GET /metrics of every router in `router_urls` and of every node in the registry. A
    router that does not answer makes the read fail; a node that does not answer (it may be
    going away) is left out of this tick."""

    def __init__(self, router_urls: Sequence[str], http: httpx.AsyncClient) -> None:
        if not router_urls:
            raise ValueError("the direct source needs at least one router URL")
        self.router_urls = [u.rstrip("/") for u in router_urls]
        self.http = http
        self._failing = False

    async def read(self, nodes: Sequence[NodeRecord]) -> tuple[Sample, ...] | None:
        samples: list[Sample] = []
        try:
            for url in self.router_urls:
                samples += await self._get(url)
        except (httpx.HTTPError, ValueError) as exc:
            self._note(False, f"router_metrics_unreachable error={type(exc).__name__}")
            return None
        for record in nodes:
            try:
                samples += await self._get(record.info.url.rstrip("/"))
            except (httpx.HTTPError, ValueError):
                log.info("node_metrics_unreachable node=%s", record.info.node_id)
        self._note(True, "router_metrics_reachable")
        return tuple(samples)

    async def _get(self, base: str) -> list[Sample]:
        resp = await self.http.get(base + METRICS)
        resp.raise_for_status()
        return parse_exposition(resp.text)

    def _note(self, ok: bool, message: str) -> None:
        if ok == self._failing:  # log changes only
            (log.info if ok else log.warning)(message)
        self._failing = not ok


class PrometheusSource:
    """One instant query to Prometheus' HTTP API for the series the planner reads."""

    def __init__(self, url: str, http: httpx.AsyncClient) -> None:
        self.url = url.rstrip("/") + "/api/v1/query"
        self.http = http
        self.query = '{__name__=~"' + "|".join(READS) + '"}'

    async def read(self, nodes: Sequence[NodeRecord]) -> tuple[Sample, ...] | None:
        try:
            resp = await self.http.get(self.url, params={"query": self.query})
            resp.raise_for_status()
            body = resp.json()
            if body.get("status") != "success":
                raise ValueError(f"status {body.get('status')!r}: {body.get('error')}")
            return tuple(_vector_sample(item) for item in body["data"]["result"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            log.warning("prometheus_unreachable url=%s error=%s", self.url, exc)
            return None


def _vector_sample(item: dict[str, object]) -> Sample:
    labels = dict(item["metric"])  # type: ignore[call-overload]
    name = str(labels.pop("__name__"))
    value = item["value"]
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError(f"bad sample value {value!r}")
    return Sample(name, {str(k): str(v) for k, v in labels.items()}, float(value[1]))
