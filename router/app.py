"""The router's FastAPI app: factory, startup/shutdown, error handlers, request metrics.

`create_app` does nothing heavy: the tokenizer loads, the node client opens and the
membership starts in the lifespan. Errors always answer in OpenAI's JSON format; bad input
never yields a 500, and a real 500 never shows internals.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cluster.auth import cluster_headers
from cluster.registry import Membership, StaticMembership
from cluster.tracing import make_tracer
from cluster.version import version
from models.tokenizer import Tokenizer
from router import endpoints
from router.adapters import RouterAdapters
from router.admission import Admission
from router.api.docs import install_docs
from router.api.embeddings.routes import embeddings_routes
from router.api.lora import lora_routes
from router.api.messages.errors import anthropic_body
from router.api.messages.routes import PREFIX as MESSAGES
from router.api.messages.routes import messages_routes
from router.api.openapi import install_openapi
from router.api.responses.routes import responses_routes
from router.api.tokenize import tokens
from router.capacity import pool_capacity
from router.dashboard import dashboard
from router.errors import APIError, bad_request, internal_error
from router.metrics import RouterMetrics, router_id
from router.node_client import NodeClient
from router.request_ids import RequestIds
from router.response_store import ResponseStore
from router.routing.kv_cost import KVWeights
from router.routing.kv_view import KVRouting
from router.routing.policy import NodePicker
from router.settings import RouterSettings
from router.state import RouterState
from router.usage import UsageLedger

log = logging.getLogger("splitserve.router")
OPENAPI_URL = "/openapi.json"


def create_app(
    settings: RouterSettings,
    *,
    membership: StaticMembership | None = None,
    tokenizer: Tokenizer | None = None,
) -> FastAPI:
    """The router app. Without `membership` it follows Redis at settings.redis_url; without
    `tokenizer` it loads the tokenizer of settings.model at startup. The app starts and
    stops the membership it uses."""
    metrics = RouterMetrics(router_id(settings))
    members = membership or Membership(settings.redis_url, settings.membership_poll_s)
    kv = KVRouting(settings.policy, metrics.kv, members)
    weights = KVWeights(
        settings.kv_prefix_weight, settings.kv_load_weight, settings.kv_usage_weight,
        settings.kv_host_weight, settings.kv_disk_weight,
    )  # fmt: skip
    state = RouterState(
        settings=settings,
        membership=members,
        metrics=metrics,
        picker=NodePicker(settings.policy, kv.index, weights),
        admission=Admission(
            settings.max_inflight,
            settings.max_queued,
            settings.retry_after_s,
            metrics,
            capacity=lambda: pool_capacity(members.nodes()),
        ),
        kv=kv,
        usage=UsageLedger(metrics.registry, metrics.base, settings.limits_by_key()),
        api_keys=settings.api_keys(),
        usage_admins=frozenset(settings.admin_key_names()),
        tokenizer=tokenizer,
        adapters=RouterAdapters(settings.lora_modules),
        responses=ResponseStore(
            settings.redis_url, settings.response_ttl_s, settings.retry_after_s
        ),
    )
    app = FastAPI(
        title="splitserve router", version=version(), lifespan=_lifespan, docs_url=None,
        redoc_url=None, openapi_url=OPENAPI_URL,
    )  # fmt: skip
    app.state.router = state
    for router in _ROUTERS:
        app.include_router(router)
    install_openapi(app, keyed=bool(state.api_keys), model=state.settings.model_name())
    install_docs(app, OPENAPI_URL)
    _install_error_handlers(app)
    app.add_middleware(RequestMetrics, metrics=metrics, routes=route_paths())
    app.add_middleware(RequestIds)  # outermost: the arrival stamp comes first
    return app


_ROUTERS = (
    endpoints.v1, endpoints.probes, endpoints.debug, tokens, lora_routes, responses_routes,
    messages_routes, embeddings_routes, dashboard,
)  # fmt: skip
# error bodies by path prefix (OpenAI's error object elsewhere)
_ERROR_SHAPES = ((MESSAGES, anthropic_body),)


def route_paths() -> set[str]:
    """Paths the router serves (the Helm chart's probes and Service rely on them)."""
    return {
        p
        for r in _ROUTERS
        for route in r.routes
        if isinstance(p := getattr(route, "path", None), str)
    }


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: RouterState = app.state.router
    settings = state.settings
    if state.tokenizer is None:
        state.tokenizer = await asyncio.to_thread(_load_tokenizer, settings)
    http = httpx.AsyncClient(
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        timeout=httpx.Timeout(settings.prefill_timeout_s, connect=settings.connect_timeout_s),
        trust_env=False,  # node traffic never goes through an HTTP proxy
    )
    state.nodes = NodeClient(
        http,
        settings.connect_timeout_s,
        settings.prefill_timeout_s,
        settings.decode_idle_timeout_s,
        cluster_headers(settings.cluster_token),
    )
    state.tracer = make_tracer(settings.trace_config("router", router_id(settings)))
    await state.membership.start()
    await state.kv.start(settings.redis_url)
    state.started_at = time.time()
    log.info("router_started model=%s policy=%s", settings.model_name(), settings.policy)
    try:
        yield
    finally:
        await state.kv.stop()
        if state.responses is not None:
            await state.responses.close()
        await state.membership.stop()
        await state.drain()
        await http.aclose()
        state.tracer.shutdown()


def _load_tokenizer(settings: RouterSettings) -> Tokenizer:
    """The model directory's tokenizer (the router reads no weights: a node may make its own,
    --load-format random)."""
    from models import resolve_model

    return Tokenizer.from_dir(resolve_model(settings.model, settings.model_cache, weights=False))


def _answer(request: Request, err: APIError) -> JSONResponse:
    """The error in the shape of the API the path belongs to."""
    path = request.url.path
    shape = next((s for prefix, s in _ERROR_SHAPES if path.startswith(prefix)), None)
    return err.response(shape)


def _install_error_handlers(app: FastAPI) -> None:
    async def api_error(request: Request, exc: Exception) -> JSONResponse:
        if not isinstance(exc, APIError):
            raise TypeError(f"unexpected {type(exc).__name__}")
        return _answer(request, exc)

    async def validation_error(request: Request, exc: Exception) -> JSONResponse:
        errors = exc.errors() if isinstance(exc, RequestValidationError) else []
        loc = [str(p) for p in errors[0]["loc"][1:]] if errors else []
        msg = errors[0]["msg"] if errors else "invalid request"
        return _answer(request, bad_request(f"invalid request: {msg}", param=".".join(loc) or None))

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        status = exc.status_code if isinstance(exc, StarletteHTTPException) else 500
        detail = exc.detail if isinstance(exc, StarletteHTTPException) else "error"
        code = {404: "not_found", 405: "method_not_allowed"}.get(status)
        return _answer(request, APIError(status, str(detail), code=code))

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error(
            "unhandled_error path=%s error=%s", request.url.path, type(exc).__name__, exc_info=exc
        )
        return _answer(request, internal_error())

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)


class RequestMetrics:
    """Pure ASGI middleware: counts answered requests by route (its template, for a path with
    parameters) and status code."""

    def __init__(self, app: ASGIApp, metrics: RouterMetrics, routes: set[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes
        self.templates = [(compile_path(p)[0], p) for p in sorted(routes) if "{" in p]

    def route(self, path: str) -> str:
        """The route a path takes (`/v1/responses/{response_id}`), or "other"."""
        if path in self.routes:
            return path
        return next((p for regex, p in self.templates if regex.match(path)), "other")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = self.route(scope.get("path", ""))

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(route, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)
