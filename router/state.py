"""What the router's request handlers share: settings, membership, tokenizer, node client,
policy, metrics, admission control, and background tasks (aborts and releases)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from cluster.registry import StaticMembership
from cluster.settings import RouterSettings
from models.tokenizer import Tokenizer
from router.errors import overloaded
from router.kv_routing import KVRouting
from router.metrics import RouterMetrics
from router.node_client import NodeClient
from router.policy import NodePicker

log = logging.getLogger("splitserve.router")


class Ticket:
    """One admitted request; `release` is idempotent."""

    def __init__(self, admission: Admission) -> None:
        self._admission: Admission | None = admission

    def release(self) -> None:
        if self._admission is not None:
            self._admission.release()
            self._admission = None


class Admission:
    """Bounds the requests served at once; past `max_inflight` the answer is 429."""

    def __init__(self, max_inflight: int, retry_after_s: int, metrics: RouterMetrics) -> None:
        self.max_inflight = max_inflight
        self.retry_after_s = retry_after_s
        self.inflight = 0
        self._metrics = metrics

    def admit(self) -> Ticket:
        if self.inflight >= self.max_inflight:
            raise overloaded(
                f"the router is serving {self.inflight} requests (limit {self.max_inflight})",
                self.retry_after_s,
            )
        self.inflight += 1
        self._metrics.inflight.set(self.inflight)
        return Ticket(self)

    def release(self) -> None:
        self.inflight -= 1
        self._metrics.inflight.set(self.inflight)


@dataclass
class RouterState:
    """Built by create_app; `tokenizer` and `nodes` are filled in at startup (lifespan)."""

    settings: RouterSettings
    membership: StaticMembership
    metrics: RouterMetrics
    picker: NodePicker
    admission: Admission
    kv: KVRouting
    api_keys: tuple[bytes, ...] = ()
    tokenizer: Tokenizer | None = None
    nodes: NodeClient | None = None
    started_at: float = 0.0
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
