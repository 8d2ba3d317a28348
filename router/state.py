"""What the router's request handlers share: settings, membership, tokenizer, node client,
policy, metrics, admission control, and background tasks (aborts and releases)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from cluster.auth import ApiKey
from cluster.registry import StaticMembership
from cluster.tracing import NO_TRACER, Tracer
from models.tokenizer import Tokenizer
from router.adapters import RouterAdapters
from router.admission import Admission
from router.metrics import RouterMetrics
from router.node_client import NodeClient
from router.request_log import RequestLog
from router.response_store import ResponseStore
from router.routing.kv_view import KVRouting
from router.routing.policy import NodePicker
from router.settings import RouterSettings
from router.usage import UsageLedger

log = logging.getLogger("splitserve.router")


@dataclass
class RouterState:
    """Built by create_app; `tokenizer` and `nodes` are filled in at startup (lifespan)."""

    settings: RouterSettings
    membership: StaticMembership
    metrics: RouterMetrics
    picker: NodePicker
    admission: Admission
    kv: KVRouting
    usage: UsageLedger
    adapters: RouterAdapters = field(default_factory=lambda: RouterAdapters([]))
    api_keys: tuple[ApiKey, ...] = ()
    usage_admins: frozenset[str] = frozenset()
    responses: ResponseStore | None = None  # the Responses API's stored responses
    tokenizer: Tokenizer | None = None
    nodes: NodeClient | None = None
    started_at: float = 0.0
    tracer: Tracer = NO_TRACER  # set at startup (lifespan) when tracing is on
    requests: RequestLog = field(default_factory=RequestLog)  # GET /debug/requests/{id}
    background: set[asyncio.Task[None]] = field(default_factory=set)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a best-effort call (abort, release) without making the client wait."""
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait for background calls at shutdown, then cancel the stragglers."""
        if not self.background:
            return
        _, pending = await asyncio.wait(set(self.background), timeout=timeout_s)
        for task in pending:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def require_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise RuntimeError("the tokenizer is loaded at startup (lifespan) and is missing")
        return self.tokenizer

    def require_nodes(self) -> NodeClient:
        if self.nodes is None:
            raise RuntimeError("the node client is created at startup (lifespan) and is missing")
        return self.nodes
