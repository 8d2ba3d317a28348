"""HTTP calls from the router to nodes, per cluster.protocol. Every call has a deadline.

Failures raise NodeCallError with a `kind` that tells the caller what to do:
- "unreachable": connection refused or reset, timeout, stream cut -> mark the node, go elsewhere
- "busy": 429 or 503 -> try another node
- "refused": another 4xx -> the request itself is bad; tell the client (400)
- "failed": 5xx, 401/403 (wrong cluster token), a malformed answer, or an error event -> try
  another node, or give up
- "deadline": the request's own deadline passed -> give up (the node is not to blame)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Literal, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from cluster import protocol as p
from cluster.node_records import NodeInfo

log = logging.getLogger("splitserve.router")

FailureKind = Literal["unreachable", "busy", "refused", "failed", "deadline"]
_JSON = {"content-type": "application/json"}
M = TypeVar("M", bound=BaseModel)


class NodeCallError(Exception):
    """A node call that did not succeed; `kind` is listed in the module docstring."""

    def __init__(
        self, node_id: str, kind: FailureKind, message: str, info: p.ErrorInfo | None = None
    ) -> None:
        super().__init__(f"node {node_id}: {message}")
        self.node_id = node_id
        self.kind = kind
        self.info = info


class NodeClient:
    """Wraps one shared keep-alive httpx.AsyncClient."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        connect_timeout_s: float,
        prefill_timeout_s: float,
        idle_timeout_s: float,
        headers: dict[str, str] | None = None,
    ) -> None:
        """`headers` go on every call (the cluster token)."""
        self._client = client
        self._headers = _JSON | (headers or {})
        self._connect = connect_timeout_s
        self._prefill_timeout = httpx.Timeout(prefill_timeout_s, connect=connect_timeout_s)
        self._idle = idle_timeout_s

    async def metrics_text(self, node: NodeInfo, timeout_s: float) -> str:
        """GET /metrics of `node` (the dashboard); httpx errors propagate."""
        resp = await self._client.get(node.url + "/metrics", timeout=timeout_s)
        resp.raise_for_status()
        return resp.text

    async def prefill(
        self,
        node: NodeInfo,
        req: p.PrefillRequest,
        deadline: float,
        trace: Mapping[str, str] | None = None,
    ) -> p.PrefillResponse:
        """POST /internal/prefill and wait for token 1, up to the prefill timeout or the
        request's `deadline` (time.monotonic), whichever comes first ("deadline" then).
        `trace`: the W3C trace context headers of the calling span."""
        return await self._within(node, p.INTERNAL_PREFILL, req, p.PrefillResponse, deadline, trace)

    async def embed(self, node: NodeInfo, req: p.EmbedRequest, deadline: float) -> p.EmbedResponse:
        """POST /internal/embed (a prefill-only pooling pass), as prefill() waits."""
        return await self._within(node, p.INTERNAL_EMBED, req, p.EmbedResponse, deadline, None)

    async def _within(
        self,
        node: NodeInfo,
        path: str,
        req: BaseModel,
        answer: type[M],
        deadline: float,
        trace: Mapping[str, str] | None,
    ) -> M:
        """POST `req` to a prefill-pool `path`, up to the prefill timeout or `deadline`."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise NodeCallError(node.node_id, "deadline", "request deadline passed")
        timeout = self._prefill_timeout
        if timeout.read is not None and left < timeout.read:
            timeout = httpx.Timeout(left, connect=min(left, timeout.connect or left))
        try:
            resp = await self._client.post(
                node.url + path,
                content=req.model_dump_json(),
                headers=self._headers | dict(trace or {}),
                timeout=timeout,
            )
        except httpx.TimeoutException as exc:
            if timeout is not self._prefill_timeout:
                raise NodeCallError(node.node_id, "deadline", "request deadline passed") from None
            raise _unreachable(node.node_id, exc) from None
        except httpx.TransportError as exc:
            raise _unreachable(node.node_id, exc) from None
        _raise_for_status(node.node_id, resp.status_code, resp.content)
        return _parse(node.node_id, answer, resp.content)

    @asynccontextmanager
    async def generate(
        self,
        node: NodeInfo,
        req: p.DecodeRequest,
        deadline: float,
        trace: Mapping[str, str] | None = None,
    ) -> AsyncIterator[AsyncIterator[p.TokenEvent]]:
        """Open POST /internal/generate; raises NodeCallError unless the node accepts it.

        Yields an iterator of events that ends after the finished event. Silence longer than
        the idle timeout, or running past `deadline` (time.monotonic), raises "unreachable".
        The node may hold its answer while the request waits in its queue (`req.wait_s`):
        that wait is not silence.
        """
        timeout = httpx.Timeout(self._connect, read=self._idle + (req.wait_s or 0.0))
        try:
            async with self._client.stream(
                "POST",
                node.url + p.INTERNAL_GENERATE,
                content=req.model_dump_json(),
                headers=self._headers | dict(trace or {}),
                timeout=timeout,
            ) as resp:
                if resp.status_code != 200:
                    _raise_for_status(node.node_id, resp.status_code, await resp.aread())
                yield self._events(node.node_id, resp, deadline)
        except httpx.TransportError as exc:
            raise _unreachable(node.node_id, exc) from None

    async def _events(
        self, node_id: str, resp: httpx.Response, deadline: float
    ) -> AsyncIterator[p.TokenEvent]:
        lines = resp.aiter_lines()
        while True:
            left = deadline - time.monotonic()
            wait = min(self._idle, left)
            try:
                async with asyncio.timeout(max(wait, 0.0)):
                    line = await anext(lines)
            except StopAsyncIteration:
                raise NodeCallError(node_id, "unreachable", "stream ended early") from None
            except httpx.TransportError as exc:
                raise _unreachable(node_id, exc) from None
            except TimeoutError:
                if left <= self._idle:
                    raise NodeCallError(node_id, "deadline", "request deadline passed") from None
                raise NodeCallError(node_id, "unreachable", f"silent for {wait:.1f}s") from None
            if not line.strip():
                continue
            event = _parse(node_id, p.TokenEvent, line.encode())
            if event.error is not None:
                raise NodeCallError(node_id, "failed", event.error.message, event.error)
            yield event
            if event.finished:
                return

    async def abort(self, node: NodeInfo, request_id: str) -> None:
        """POST /internal/abort; best effort (failures are logged)."""
        await self._control(
            node,
            p.INTERNAL_ABORT,
            p.AbortRequest(request_id=request_id, protocol_version=p.PROTOCOL_VERSION),
        )

    async def release(self, node: NodeInfo, request_id: str) -> None:
        """POST /internal/release; best effort (the lease expires anyway)."""
        await self._control(
            node,
            p.INTERNAL_RELEASE,
            p.ReleaseRequest(request_id=request_id, protocol_version=p.PROTOCOL_VERSION),
        )

    async def lora(self, node: NodeInfo, path: str, msg: p.LoadAdapterRequest) -> bool:
        """POST a LoRA load or unload (`path`); its `done`; NodeCallError when refused or
        unreachable (a load reads the adapter: up to the prefill timeout)."""
        try:
            resp = await self._client.post(
                node.url + path,
                content=msg.model_dump_json(),
                headers=self._headers,
                timeout=self._prefill_timeout,
            )
        except httpx.TransportError as exc:
            raise _unreachable(node.node_id, exc) from None
        _raise_for_status(node.node_id, resp.status_code, resp.content)
        return _parse(node.node_id, p.ControlResponse, resp.content).done

    async def _control(self, node: NodeInfo, path: str, msg: BaseModel) -> None:
        try:
            resp = await self._client.post(
                node.url + path,
                content=msg.model_dump_json(),
                headers=self._headers,
                timeout=self._connect * 2,
            )
        except httpx.TransportError as exc:
            log.warning("control_failed node=%s path=%s error=%s", node.node_id, path, exc)
            return
        if resp.status_code != 200:
            log.warning(
                "control_failed node=%s path=%s status=%d", node.node_id, path, resp.status_code
            )


def _unreachable(node_id: str, exc: Exception) -> NodeCallError:
    return NodeCallError(node_id, "unreachable", f"{type(exc).__name__}: {exc}")


def _raise_for_status(node_id: str, status: int, body: bytes) -> None:
    if status < 300:
        return
    info = _error_info(body)
    message = f"HTTP {status}: {info.message if info else body[:200]!r}"
    kind: FailureKind
    if status in (429, 503):
        kind = "busy"
    elif status in (401, 403):  # a cluster token mismatch is the cluster's fault, not the client's
        kind = "failed"
    elif 400 <= status < 500:
        kind = "refused"
    else:
        kind = "failed"
    raise NodeCallError(node_id, kind, message, info)


def _error_info(body: bytes) -> p.ErrorInfo | None:
    try:
        return p.NodeErrorResponse.model_validate_json(body).error
    except ValidationError:
        return None


def _parse(node_id: str, cls: type[M], raw: bytes) -> M:
    try:
        return cls.model_validate_json(raw)
    except ValidationError as exc:
        raise NodeCallError(node_id, "failed", f"malformed {cls.__name__}: {exc}") from None
