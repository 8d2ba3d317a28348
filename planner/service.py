"""`splitserve planner` as a process: every interval, read the registry and the metrics,
decide, and publish: GET /metrics (Prometheus, KEDA / HPA), GET /status (the decision as
JSON: the launcher of `splitserve up --planner` acts on it), and a Redis key the router's
dashboard shows. A Redis or metrics outage holds the decision; nothing stops the loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from cluster.planner_status import PlannerStatus, status_key
from cluster.registry import REDIS_ERRORS, Membership
from planner.metrics import PlannerMetrics
from planner.observation import NodeView, Scrape
from planner.planner import Planner
from planner.sources import Source

log = logging.getLogger("splitserve.planner")


class PlannerService:
    """One planner: `tick()` once per interval (the clock is injectable for tests)."""

    def __init__(
        self,
        planner: Planner,
        membership: Membership,
        source: Source,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.planner = planner
        self.membership = membership
        self.source = source
        self.clock = clock
        self.metrics = PlannerMetrics()
        self.status: PlannerStatus | None = None

    async def tick(self) -> PlannerStatus:
        await self.membership.refresh()  # on failure: the last known nodes
        records = self.membership.all_nodes()
        samples = await self.source.read(records)
        nodes = tuple(
            NodeView(r.info.node_id, r.info.role, r.load.running, r.load.waiting, r.load.kv_usage)
            for r in records
        )
        status = self.planner.tick(Scrape(self.clock(), nodes, samples))
        self.metrics.publish(status)
        self.status = status
        await self._store(status)
        for name, pool in status.pools.items():
            if pool.direction is not None:
                log.info(
                    "planner_decision pool=%s current=%d desired=%d reason=%s load=%.1f",
                    name, pool.current, pool.desired, pool.reason, pool.load,
                )  # fmt: skip
        return status

    async def _store(self, status: PlannerStatus) -> None:
        redis = self.membership.redis
        if redis is None:
            return
        ttl_ms = int((3 * status.interval_s + 5) * 1000)
        with contextlib.suppress(*REDIS_ERRORS):
            key = status_key(self.membership.namespace)
            await redis.set(key, status.model_dump_json(), px=ttl_ms)

    async def run(self, stop: asyncio.Event) -> None:
        interval = self.planner.config.interval_s
        while not stop.is_set():
            try:
                await self.tick()
            except Exception:  # a bug in one tick must not end the planner
                log.exception("planner_tick_failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)


def create_app(service: PlannerService) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        stop = asyncio.Event()
        await service.membership.start()
        task = asyncio.create_task(service.run(stop), name="planner")
        try:
            yield
        finally:
            stop.set()
            await asyncio.wait({task}, timeout=10)
            await service.membership.stop()

    app = FastAPI(title="splitserve planner", lifespan=lifespan, docs_url=None, redoc_url=None)

    @app.get("/metrics")
    async def metrics() -> Response:
        body, content_type = service.metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/status")
    async def status() -> Response:
        if service.status is None:
            return JSONResponse({"status": "starting"}, status_code=503)
        return Response(service.status.model_dump_json(), media_type="application/json")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app
