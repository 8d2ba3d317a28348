"""The prefill node's HTTP app: the shared node endpoints plus POST /internal/prefill and
POST /internal/release (cluster.protocol). `create_app` loads nothing; the model loads in
the lifespan."""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from cluster.protocol import (
    INTERNAL_PREFILL,
    INTERNAL_RELEASE,
    ControlResponse,
    PrefillRequest,
    ReleaseRequest,
)
from node.body import read_body
from node.server import accepting_work, create_node_app, node_route_paths, runtime_of
from node.settings import NodeSettings
from prefill_node.runtime import PrefillRuntime

routes = APIRouter()


def create_app(settings: NodeSettings) -> FastAPI:
    """The prefill node app; `settings.role` must be "prefill"."""
    if settings.role != "prefill":
        raise ValueError(f"a prefill node needs role=prefill, got {settings.role!r}")
    return create_node_app(settings, routes, PrefillRuntime.open, "splitserve prefill node")


def route_paths() -> set[str]:
    """Paths the prefill node serves (the Helm chart's probes rely on them)."""
    return node_route_paths(routes)


def _runtime(request: Request) -> PrefillRuntime:
    runtime: PrefillRuntime = runtime_of(request)
    return runtime


@routes.post(INTERNAL_PREFILL, dependencies=[Depends(accepting_work)])
async def prefill(request: Request) -> Response:
    body = await read_body(request, PrefillRequest)
    response = await _runtime(request).prefill(body, request.headers)
    return Response(response.model_dump_json(), media_type="application/json")


@routes.post(INTERNAL_RELEASE)
async def release(body: ReleaseRequest, request: Request) -> JSONResponse:
    done = await _runtime(request).release(body.request_id)
    return JSONResponse(ControlResponse(request_id=body.request_id, done=done).model_dump())
