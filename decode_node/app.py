"""The decode node's HTTP app (roles decode and colocated): the shared node endpoints plus
POST /internal/generate (an NDJSON stream of TokenEvents) and POST /internal/abort
(cluster.protocol). `create_app` loads nothing; the model loads in the lifespan."""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from cluster.protocol import (
    INTERNAL_ABORT,
    INTERNAL_GENERATE,
    AbortRequest,
    ControlResponse,
    DecodeRequest,
)
from decode_node.events import EventStream
from decode_node.runtime import DecodeRuntime
from node.body import read_body
from node.server import accepting_work, create_node_app, node_route_paths, runtime_of
from node.settings import NodeSettings

routes = APIRouter()
ROLES = ("decode", "colocated")


def create_app(settings: NodeSettings) -> FastAPI:
    """The decode node app; `settings.role` is "decode" or "colocated"."""
    if settings.role not in ROLES:
        raise ValueError(f"a decode node needs role decode or colocated, got {settings.role!r}")
    return create_node_app(settings, routes, DecodeRuntime.open, f"splitserve {settings.role} node")


def route_paths() -> set[str]:
    """Paths the decode node serves (the Helm chart's probes rely on them)."""
    return node_route_paths(routes)


def _runtime(request: Request) -> DecodeRuntime:
    runtime: DecodeRuntime = runtime_of(request)
    return runtime


@routes.post(INTERNAL_GENERATE, dependencies=[Depends(accepting_work)])
async def generate(request: Request) -> EventStream:
    body = await read_body(request, DecodeRequest)
    runtime = _runtime(request)
    events, on_close = await runtime.generate(body, request.headers)
    return EventStream(events, on_close, alive=runtime.engine_working)


@routes.post(INTERNAL_ABORT)
async def abort(body: AbortRequest, request: Request) -> JSONResponse:
    done = await _runtime(request).abort(body.request_id)
    return JSONResponse(ControlResponse(request_id=body.request_id, done=done).model_dump())
