"""What every node serves, whatever its role: the FastAPI shell, /health, /ready, /stats,
/metrics, the registry heartbeat, and error answers in the protocol's format
(node.errors). The probes (/health, /ready) and /metrics are open; /stats, which publishes the
transfer agent's metadata and the KV cache's memory address, needs the cluster token as the
role's /internal/* endpoints do (when the node has one).

Torch-free. A role package (prefill_node, decode_node) adds its internal endpoints and a
`NodeRuntime` factory; `create_node_app` loads nothing: the runtime (model, engine thread,
transfer agent) opens in the app's lifespan, then the node registers in Redis and beats
every `heartbeat_s` with a TTL of `ttl_s`. A Redis outage is survived: the node keeps
serving, reports not ready, and registers again when Redis answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from cluster.auth import CLUSTER_TOKEN_HEADER, token_ok
from cluster.node_records import NodeInfo, NodeLoad, NodeStats
from cluster.protocol import (
    HEALTH,
    INTERNAL_EMBED,
    INTERNAL_LORA_LOAD,
    INTERNAL_LORA_UNLOAD,
    READY,
    STATS,
    VERSION,
    ControlResponse,
    EmbedRequest,
    LoadAdapterRequest,
)
from cluster.registry import REDIS_ERRORS, NodeRegistry
from cluster.version import build_info
from node.body import read_body
from node.drain import wait_for_leases
from node.errors import NodeError, bad_request, not_ready
from node.metrics import NodeMetrics
from node.settings import NodeSettings

log = logging.getLogger("splitserve.node")

HEARTBEAT_STOP_S = 5.0
METRICS = "/metrics"


class NodeRuntime(Protocol):
    """A loaded node as the shared endpoints see it."""

    @property
    def info(self) -> NodeInfo: ...

    @property
    def healthy(self) -> bool:
        """False once the engine thread has died: the node must be restarted."""
        ...

    def load(self) -> NodeLoad: ...

    def counters(self) -> dict[str, float]: ...

    def on_fatal(self, callback: Callable[[str], None]) -> None:
        """Have ``callback(reason)`` called (from any thread) once the node can never serve
        again (a tensor-parallel rank died): the process then exits (node.drain)."""
        ...


RuntimeFactory = Callable[[NodeSettings, NodeMetrics], AbstractAsyncContextManager[Any]]


@dataclass
class NodeState:
    """Per-app state the shared endpoints read; `runtime` is set once the lifespan opened it."""

    settings: NodeSettings
    metrics: NodeMetrics
    runtime: Any = None  # the role's runtime, a NodeRuntime
    registered: bool = False
    drain_deadline: float | None = None  # time.monotonic() once SIGTERM came
    leave: asyncio.Event = field(default_factory=asyncio.Event)  # ends the heartbeats
    exit_on_fatal: Callable[[str], None] | None = None  # set by the server that runs the app

    @property
    def serving(self) -> bool:
        """Loaded, its engine alive and not draining: it takes work, registered or not."""
        healthy = self.runtime is not None and self.runtime.healthy
        return healthy and self.drain_deadline is None

    @property
    def ready(self) -> bool:
        return self.serving and self.registered


def begin_drain(app: FastAPI) -> None:
    """SIGTERM: stop taking work and leave the registry now (node.drain). Idempotent."""
    state: NodeState = app.state.node
    if state.drain_deadline is not None:
        return
    state.drain_deadline = time.monotonic() + state.settings.drain_timeout_s
    state.leave.set()
    log.info(
        "node_draining node=%s timeout_s=%.0f",
        state.settings.resolved_node_id(), state.settings.drain_timeout_s,
    )  # fmt: skip


async def accepting_work(request: Request) -> None:
    """503 "draining" for new requests once the node drains (aborts and releases still go).
    A coroutine, as require_cluster_token: FastAPI runs a plain function dependency in its
    thread pool, a hop per call on the path of every request's first token."""
    if node_state(request).drain_deadline is not None:
        raise NodeError(503, "draining", "the node is shutting down; try another node")


def node_state(request: Request) -> NodeState:
    state: NodeState = request.app.state.node
    return state


async def require_cluster_token(request: Request) -> None:
    """401 unless the call carries the cluster token (when the node has one)."""
    expected = node_state(request).settings.cluster_token
    if not token_ok(request.headers.get(CLUSTER_TOKEN_HEADER), expected):
        raise NodeError(401, "unauthorized", "missing or wrong cluster token")


def runtime_of(request: Request) -> Any:
    """The role's runtime; 503 while the node is still loading."""
    runtime = node_state(request).runtime
    if runtime is None:
        raise not_ready()
    return runtime


def create_node_app(
    settings: NodeSettings, routes: APIRouter, open_runtime: RuntimeFactory, title: str
) -> FastAPI:
    """The node app: shared probes plus the role's `routes`; `open_runtime(settings,
    metrics)` is entered in the lifespan and must yield a NodeRuntime that records its
    request latencies in `metrics`."""
    state = NodeState(settings, NodeMetrics(settings.role, settings.resolved_node_id()))
    app = FastAPI(
        title=title, lifespan=_lifespan(open_runtime), docs_url=None, redoc_url=None,
        openapi_url=None,
    )  # fmt: skip
    app.state.node = state
    app.include_router(probes)
    app.include_router(guarded)
    app.include_router(routes, dependencies=[Depends(require_cluster_token)])
    _install_error_handlers(app)
    return app


def node_route_paths(routes: APIRouter) -> set[str]:
    """Paths a node with the role's `routes` serves (the Helm chart's probes rely on them)."""
    return {
        path
        for router in (probes, guarded, routes)
        for route in router.routes
        if isinstance(path := getattr(route, "path", None), str)
    }


def _lifespan(
    open_runtime: RuntimeFactory,
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state: NodeState = app.state.node
        settings = state.settings
        started = time.monotonic()
        async with open_runtime(settings, state.metrics) as runtime:
            state.runtime = runtime
            runtime.on_fatal(lambda reason: _fatal(state, reason))
            state.metrics.watch(runtime.counters)
            registry = NodeRegistry(settings.redis_url, settings.ttl_s)
            stop = state.leave
            beats = asyncio.create_task(_heartbeats(state, registry, stop), name="heartbeat")
            log.info(
                "node_loaded node=%s role=%s url=%s load_s=%.1f",
                runtime.info.node_id, settings.role, runtime.info.url,
                time.monotonic() - started,
            )  # fmt: skip
            try:
                yield
            finally:
                await _stop_beating(beats, stop)
                state.registered = False
                await registry.deregister()
                await registry.close()
                deadline = state.drain_deadline or time.monotonic()
                await wait_for_leases(lambda: runtime.load().leases_held, deadline)
                state.metrics.watch(None)
                state.runtime = None

    return lifespan


def _fatal(state: NodeState, reason: str) -> None:
    """The node can no longer serve: leave (the heartbeats stop, the record goes) and end the
    process with a non-zero code, like a killed node (any thread)."""
    log.error("node_fatal node=%s reason=%s", state.settings.resolved_node_id(), reason)
    if state.exit_on_fatal is not None:
        state.exit_on_fatal(reason)


async def _heartbeats(state: NodeState, registry: NodeRegistry, stop: asyncio.Event) -> None:
    """Register at once, then rewrite the record every heartbeat_s until `stop`; log outages
    once. A node whose engine thread died leaves the registry and stops beating (/health
    turns 503); so does a draining node, at once."""
    runtime: NodeRuntime = state.runtime
    while not stop.is_set():
        if not runtime.healthy:
            log.error("engine_dead node=%s leaving the registry", runtime.info.node_id)
            state.registered = False
            await registry.deregister()
            return
        try:
            await registry.register(runtime.info, runtime.load())
            if not state.registered:
                log.info("node_registered node=%s", runtime.info.node_id)
            state.registered = True
        except REDIS_ERRORS as exc:
            if state.registered:
                log.warning("redis_unreachable node=%s error=%s", runtime.info.node_id, exc)
            state.registered = False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), state.settings.heartbeat_s)
    if state.drain_deadline is not None:
        state.registered = False
        await registry.deregister()
        log.info("node_deregistered node=%s", runtime.info.node_id)


async def _stop_beating(beats: asyncio.Task[None], stop: asyncio.Event) -> None:
    """End the heartbeat loop through its event, not by cancelling it: on Python 3.11 a
    cancel that lands while redis' own timeout fires becomes a TimeoutError, which the loop
    survives, and awaiting the task would then hang."""
    stop.set()
    done, _ = await asyncio.wait({beats}, timeout=HEARTBEAT_STOP_S)
    if not done:
        beats.cancel()
        log.warning("heartbeat loop did not stop in %.0fs; cancelled", HEARTBEAT_STOP_S)


probes = APIRouter()
guarded = APIRouter(dependencies=[Depends(require_cluster_token)])


@probes.get(HEALTH)
async def health(request: Request) -> JSONResponse:
    """200 while the process serves; 503 once its engine thread has died."""
    runtime = node_state(request).runtime
    if runtime is not None and not runtime.healthy:
        return JSONResponse({"status": "engine_dead"}, status_code=503)
    return JSONResponse({"status": "ok"})


@probes.get(READY)
async def ready(request: Request) -> JSONResponse:
    """200 once the model is loaded and the node is registered in Redis. `serving`: it takes
    work even while unregistered (Redis out of its reach; routers keep such a node)."""
    state = node_state(request)
    body = {
        "status": "ready" if state.ready else ("draining" if state.drain_deadline else "not_ready"),
        "loaded": state.runtime is not None,
        "registered": state.registered,
        "serving": state.serving,
    }
    return JSONResponse(body, status_code=200 if state.ready else 503)


@probes.get(VERSION)
async def version() -> dict[str, str]:
    import torch

    return {**build_info(), "torch": torch.__version__}


@guarded.get(STATS)
async def stats(request: Request) -> JSONResponse:
    """Identity (peer_info included: transfer metadata and addresses), load and counters."""
    runtime: NodeRuntime = runtime_of(request)
    body = NodeStats(info=runtime.info, load=runtime.load(), counters=runtime.counters())
    return JSONResponse(body.model_dump(mode="json"))


@guarded.post(INTERNAL_LORA_LOAD)
async def load_lora(body: LoadAdapterRequest, request: Request) -> ControlResponse:
    """Load a LoRA adapter (node.adapters); 400 naming the file when it cannot be served."""
    await runtime_of(request).adapters.load(body.lora_name, body.lora_path)
    return ControlResponse(request_id=body.lora_name, done=True)


@guarded.post(INTERNAL_EMBED, dependencies=[Depends(accepting_work)])
async def embed(request: Request) -> Response:
    """A prompt's pooled vector from a prefill-only pass (node.pooling): any role serves it."""
    body = await read_body(request, EmbedRequest)
    answer = await runtime_of(request).embed(body)
    return Response(answer.model_dump_json(), media_type="application/json")


@guarded.post(INTERNAL_LORA_UNLOAD)
async def unload_lora(body: LoadAdapterRequest, request: Request) -> ControlResponse:
    done = await runtime_of(request).adapters.unload(body.lora_name)
    return ControlResponse(request_id=body.lora_name, done=done)


@probes.get(METRICS)
async def metrics(request: Request) -> Response:
    state = node_state(request)
    if state.runtime is not None:
        state.metrics.observe(state.runtime.load())
    body, content_type = state.metrics.render()
    return Response(body, media_type=content_type)


def _install_error_handlers(app: FastAPI) -> None:
    async def node_error(_: Request, exc: Exception) -> JSONResponse:
        if not isinstance(exc, NodeError):
            raise TypeError(f"unexpected {type(exc).__name__}")
        return exc.response()

    async def validation_error(_: Request, exc: Exception) -> JSONResponse:
        errors = exc.errors() if isinstance(exc, RequestValidationError) else []
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        param = ".".join(str(p) for p in first["loc"][1:]) or None
        return bad_request(f"invalid request: {first['msg']}", param).response()

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled_error path=%s", request.url.path, exc_info=exc)
        return NodeError(500, "internal", "internal error in the node").response()

    app.add_exception_handler(NodeError, node_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, unexpected)
