"""Graceful drain of a node on SIGTERM (docs/design.md, failure semantics).

At the signal, at once: /ready answers 503, the heartbeats stop and the node leaves the
registry (routers stop picking it at their next poll), and /internal/prefill and
/internal/generate answer 503 "draining" (a router tries another node). Running work goes
on: uvicorn stops accepting connections and gives open ones `drain_timeout_s` to finish;
a decode stream still running then is cut, and the router resumes it on another decode
node from prompt + tokens so far. A prefill node then waits, within the same deadline, for
the decode nodes to pull the KV blocks it leased, so their transfers do not fail.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn

log = logging.getLogger("splitserve.node")

LEASE_POLL_S = 0.05


FATAL_EXIT_CODE = 4  # the node stopped itself: it can never serve again (a rank died)


class DrainingServer(uvicorn.Server):
    """uvicorn's server that also calls `on_drain` (in the event loop) at SIGTERM / SIGINT,
    and stops with `exit_code` FATAL_EXIT_CODE after `fail`."""

    def __init__(self, config: uvicorn.Config, on_drain: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_drain = on_drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self.exit_code = 0

    def fail(self, reason: str) -> None:
        """Stop serving (open streams, already failed by the engine loop, close; the lifespan
        leaves the registry) and exit with FATAL_EXIT_CODE. Thread safe."""
        self.exit_code = FATAL_EXIT_CODE
        self.should_exit = True  # uvicorn's main loop polls it

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets=sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig in (signal.SIGTERM, signal.SIGINT) and self._loop is not None:
            self._loop.call_soon_threadsafe(self._on_drain)
        super().handle_exit(sig, frame)


async def wait_for_leases(held: Callable[[], int], deadline: float) -> int:
    """Wait until `held()` (leases this node still holds) is 0 or time.monotonic() passes
    `deadline`; returns what is left."""
    left = held()
    while left and time.monotonic() < deadline:
        await asyncio.sleep(LEASE_POLL_S)
        left = held()
    if left:
        log.warning("drain_deadline leases_left=%d", left)
    return left
