"""Engine outputs -> protocol TokenEvents, and the NDJSON response that streams them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence

import anyio
from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from cluster.protocol import ErrorInfo, TokenEvent, TokenLogprobMsg
from engine.loop.stream import StreamOutput
from engine.scheduler.request import FinishReason

NDJSON = "application/x-ndjson"
# While no event is due (a request queued behind others, a long step), an empty line goes out
# this often, so the router's silence timeout (decode_idle_timeout_s, 30 s by default) tells a
# dead or hung node from a busy one; the router skips empty lines.
KEEPALIVE_S = 5.0


def token_event(
    items: Sequence[StreamOutput],
    num_prompt_tokens: int,
    num_cached_tokens: int,
    logprobs: bool,
    num_prefix_hit_tokens: int = 0,
) -> TokenEvent:
    """One event for outputs delivered together: their tokens in order; finished when the
    last one is."""
    last = items[-1].output
    tokens = [t for item in items for t in item.output.new_token_ids]
    return TokenEvent(
        token_ids=tokens,
        logprobs=[
            TokenLogprobMsg.model_validate(lp, from_attributes=True)
            for item in items
            for lp in item.output.logprobs
        ]
        if logprobs
        else None,
        finished=last.finished,
        finish_reason=wire_reason(last.finish_reason) if last.finished else None,
        num_prompt_tokens=num_prompt_tokens,
        num_cached_tokens=num_cached_tokens,
        num_prefix_hit_tokens=num_prefix_hit_tokens,
    )


def wire_reason(reason: FinishReason | None) -> str:
    """The protocol's finish_reason; a request that ended at admission (its last given token
    was a stop) reports "stop"."""
    if reason in (FinishReason.LENGTH, FinishReason.ABORT):
        return reason.value
    return FinishReason.STOP.value


def error_event(code: str, message: str) -> TokenEvent:
    """The final event of a stream that failed after it started."""
    return TokenEvent(
        finished=True, finish_reason="error", error=ErrorInfo(code=code, message=message)
    )


def abort_event() -> TokenEvent:
    return TokenEvent(finished=True, finish_reason=FinishReason.ABORT.value)


class EventStream(StreamingResponse):
    """Streams pydantic events as NDJSON lines, with an empty line every `keepalive_s` while
    `alive()` says the engine is working and no event is due. Stops the event generator as
    soon as the client disconnects, even while no event is due, then calls `on_close`
    (always, also when the stream never started)."""

    def __init__(
        self,
        events: AsyncGenerator[BaseModel, None],
        on_close: Callable[[], None],
        alive: Callable[[], bool] = lambda: True,
        keepalive_s: float = KEEPALIVE_S,
    ) -> None:
        self._events = events
        self._on_close = on_close
        self._alive = alive
        self._keepalive_s = keepalive_s
        self._next: asyncio.Future[BaseModel] | None = None  # the event being awaited
        super().__init__(self._lines(), media_type=NDJSON)

    async def _lines(self) -> AsyncIterator[bytes]:
        while True:
            if self._next is None:
                self._next = asyncio.ensure_future(anext(self._events))
            done, _ = await asyncio.wait((self._next,), timeout=self._keepalive_s)
            if not done:
                if self._alive():
                    yield b"\n"
                continue
            future, self._next = self._next, None
            try:
                event = future.result()
            except StopAsyncIteration:
                return
            yield event.model_dump_json().encode() + b"\n"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def write() -> None:
                    with contextlib.suppress(OSError):  # the client went away mid-write
                        await self.stream_response(send)
                    group.cancel_scope.cancel()

                group.start_soon(write)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            try:
                if self._next is not None:  # the generator is busy until its step is cancelled
                    self._next.cancel()
                    await asyncio.wait((self._next,))
                await self._events.aclose()
            finally:
                self._on_close()
