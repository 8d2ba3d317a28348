"""HTTP endpoints: the OpenAI API (/v1/...) and the probes (/health, /ready, /metrics).

Request bodies are read and validated here rather than by FastAPI, so that the size limit
(413), malformed JSON and bad fields (400 naming the parameter) all answer in OpenAI's
error format. Order of checks: API key, body size, schema, model name, admission (429),
nodes (503), prompt and context length (400), then the cluster (router.serve).
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from cluster.auth import find_key
from cluster.protocol import VERSION
from cluster.version import build_info
from router.api.ignored import ignored_fields, shown
from router.api.objects import ModelCard, ModelList
from router.api.parse import parse_request
from router.api.requests import ChatCompletionRequest, CompletionRequest
from router.errors import APIError
from router.routing.policy import Pools
from router.serve import serve
from router.state import RouterState
from router.usage import ANONYMOUS

log = logging.getLogger("splitserve.router")


def get_state(request: Request) -> RouterState:
    state: RouterState = request.app.state.router
    return state


async def require_api_key(request: Request) -> None:
    """401 unless `Authorization: Bearer <key>` (or Anthropic's `x-api-key: <key>`) names one
    of the keys (when keys are set).
    The key's name (`anonymous` without keys) is what usage and limits count by. A coroutine:
    FastAPI runs a plain function dependency in its thread pool, a hop per request."""
    keys = get_state(request).api_keys
    request.state.key_name = ANONYMOUS
    if not keys:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    key = find_key(token.strip(), keys) if scheme.lower() == "bearer" else None
    if key is None and "x-api-key" in request.headers:
        key = find_key(request.headers["x-api-key"].strip(), keys)
    if key is None:
        raise APIError(
            401,
            "missing or invalid API key: send `Authorization: Bearer <key>`",
            type="authentication_error",
            code="invalid_api_key",
        )
    request.state.key_name = key.name


v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])
debug = APIRouter(prefix="/debug", dependencies=[Depends(require_api_key)])
probes = APIRouter()


@v1.get("/models")
async def list_models(request: Request) -> JSONResponse:
    state = get_state(request)
    lens = Pools.of(state.membership.nodes()).max_model_len()
    base, created = state.settings.model_name(), int(state.started_at)
    max_len = state.settings.max_model_len or lens
    cards = [ModelCard(id=base, created=created, max_model_len=max_len, root=base)]
    cards += [
        ModelCard(id=name, created=created, max_model_len=max_len, root=path, parent=base)
        for name, path in state.adapters.items()
    ]
    return JSONResponse(ModelList(data=cards).model_dump())


@v1.get("/usage")
async def usage(request: Request) -> JSONResponse:
    """Usage by key name since the router started; for the keys named in usage_admin_keys
    (anyone when the router needs no key)."""
    state = get_state(request)
    require_admin(state, request, "usage")
    return JSONResponse({"object": "list", "data": state.usage.report()})


def require_admin(state: RouterState, request: Request, what: str) -> None:
    """403 unless the request's key is named in usage_admin_keys (or no key is needed)."""
    if state.api_keys and request.state.key_name not in state.usage_admins:
        raise APIError(
            403,
            f"this API key may not read {what} (see usage_admin_keys)",
            type="permission_error",
            code="forbidden",
        )


@debug.get("/requests/{request_id}")
async def debug_request(request_id: str, request: Request) -> JSONResponse:
    """Where a request is now (node, phase, time in it), or a finished one's phase timings
    (the last 1,000); by its x-request-id or the id the nodes know it by."""
    state = get_state(request)
    require_admin(state, request, "/debug/requests")
    trail = state.requests.find(request_id)
    if trail is None:
        raise APIError(
            404,
            f"no request {request_id!r} is in flight or among the last finished ones",
            param="request_id",
            code="not_found",
        )
    return JSONResponse(trail.view())


@v1.post("/chat/completions")
async def chat_completions(request: Request) -> Response:
    state = get_state(request)
    body = await read_body(request, state.settings.max_body_bytes)
    req: ChatCompletionRequest = parse_request(ChatCompletionRequest, body)
    note_ignored(state, "/v1/chat/completions", req)
    return await serve(request, state, req, "chat")


@v1.post("/completions")
async def completions(request: Request) -> Response:
    state = get_state(request)
    body = await read_body(request, state.settings.max_body_bytes)
    req: CompletionRequest = parse_request(CompletionRequest, body)
    note_ignored(state, "/v1/completions", req)
    return await serve(request, state, req, "completion")


def note_ignored(state: RouterState, route: str, req: BaseModel) -> None:
    """Log and count the fields `req` ignored: their names only, never a value."""
    names = ignored_fields(req)
    if names:
        state.metrics.ignored_fields.labels(route).inc(len(names))
        log.info("ignored_fields route=%s count=%d fields=%s", route, len(names), shown(names))


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, or 413 as soon as it exceeds `max_bytes`."""
    too_large = APIError(
        413, f"request body exceeds {max_bytes} bytes", param=None, code="request_too_large"
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_large
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > max_bytes:
            raise too_large
        parts.append(part)
    return b"".join(parts)


@probes.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@probes.get(VERSION)
async def version() -> dict[str, str]:
    return build_info()


@probes.get("/ready")
async def ready(request: Request) -> JSONResponse:
    """200 once a prefill and a decode node (or a colocated node) are known, else 503."""
    state = get_state(request)
    pools = Pools.of(state.membership.nodes())
    body = {
        "status": "ready" if pools.ready else "not_ready",
        "prefill_nodes": len(pools.prefill),
        "decode_nodes": len(pools.decode),
        "colocated_nodes": len(pools.colocated),
        "incompatible_nodes": state.membership.incompatible(),  # their protocol version
    }
    if pools.ready:
        return JSONResponse(body)
    headers = {"Retry-After": str(state.settings.retry_after_s)}
    return JSONResponse(body, status_code=503, headers=headers)


@probes.get("/metrics")
async def metrics(request: Request) -> Response:
    body, content_type = get_state(request).metrics.render()
    return Response(body, media_type=content_type)
