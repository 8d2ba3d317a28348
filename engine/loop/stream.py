"""What asyncio code reads of a request that runs in the engine thread: its outputs, in
order, on the event loop that opened it (EngineLoop delivers them with
`call_soon_threadsafe`)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from engine.outputs import RequestOutput


@dataclass(frozen=True)
class StreamOutput:
    """One item of a request's stream: the request's part of a step (`output`) and what the
    engine thread adds as it delivers it. `pinned_block_ids`: in the prefill role, the blocks
    the request holds once its first token is out (finish_reason PREFILLED), read in the
    engine thread during the same step. `scheduled_at`: time.monotonic() at the start of the
    first step that scheduled the request (None if none did), for queue-time metrics."""

    output: RequestOutput
    pinned_block_ids: tuple[int, ...] = ()
    scheduled_at: float | None = None


class EngineFailed(RuntimeError):
    """The engine failed or stopped while running the request; its blocks are freed."""


class RequestStream:
    """The outputs of one request, in order, read on the event loop that opened it.

    The last output has `output.finished` set (abort included); an engine failure raises
    EngineFailed instead.
    """

    def __init__(self, request_id: str, items: asyncio.Queue[StreamOutput | EngineFailed]) -> None:
        self.request_id = request_id
        self._items = items

    async def get(self, timeout_s: float) -> StreamOutput:
        """The next output; TimeoutError after `timeout_s` seconds without one."""
        async with asyncio.timeout(timeout_s):
            item = await self._items.get()
        return _unwrap(item)

    def get_nowait(self) -> StreamOutput | None:
        """An output already delivered, or None."""
        try:
            item = self._items.get_nowait()
        except asyncio.QueueEmpty:
            return None
        return _unwrap(item)


def _unwrap(item: StreamOutput | EngineFailed) -> StreamOutput:
    if isinstance(item, EngineFailed):
        raise item
    return item


@dataclass(frozen=True)
class OutputSink:
    """Where the engine thread puts one request's outputs."""

    loop: asyncio.AbstractEventLoop
    items: asyncio.Queue[StreamOutput | EngineFailed]

    def put(self, item: StreamOutput | EngineFailed) -> None:
        with contextlib.suppress(RuntimeError):  # a closed event loop: nobody listens
            self.loop.call_soon_threadsafe(self.items.put_nowait, item)
