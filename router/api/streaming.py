"""Server-sent events: chunk encoding, the stream of one request, and a response class
that always cleans up (aborts the decode, releases the lease) however the stream ends."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Literal

import anyio
from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from router.api.objects import ChatCompletionChunk, Usage
from router.api.render import Formatter, chunks_of, make_usage
from router.api.text_deltas import OutputProcessor, TextDelta
from router.errors import APIError, internal_error
from router.flow.request_flow import RequestFlow

log = logging.getLogger("splitserve.router")

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(payload: BaseModel | dict[str, Any], with_usage: bool = False) -> bytes:
    """One `data:` event. Fields without a value yet go out as null, as OpenAI sends them
    (`finish_reason`, `logprobs`); `usage` only when the client asked for it
    (stream_options.include_usage), null until the last chunk."""
    if isinstance(payload, BaseModel):
        exclude = None if with_usage or getattr(payload, "usage", None) else {"usage"}
        body = payload.model_dump_json(exclude=exclude)
    else:
        body = json.dumps(payload, separators=(",", ":"))
    return b"data: " + body.encode() + b"\n\n"


def named_event(kind: str, body: dict[str, Any]) -> bytes:
    """One `event: KIND` with its JSON `data` (the Responses and Messages APIs' events)."""
    return f"event: {kind}\ndata: {json.dumps(body, separators=(',', ':'))}\n\n".encode()


@dataclass(frozen=True)
class Piece:
    """One part of a chat delta: thinking or answer text, a tool call's start (its id and
    name), or a piece of its arguments."""

    kind: Literal["thinking", "text", "call", "arguments"]
    text: str  # the text, the call's name, or the piece of its arguments
    call_id: str = ""


class ChatDeltas:
    """A dialect's reading of the chat chunks of one choice: the pieces of each delta in
    order; once read, the finish reason and the usage the stream ended with."""

    def __init__(self, chunks: AsyncIterator[BaseModel]) -> None:
        self._chunks = chunks
        self.finish: str | None = None
        self.usage: Usage | None = None

    async def __aiter__(self) -> AsyncIterator[Piece]:
        async for chunk in self._chunks:
            if not isinstance(chunk, ChatCompletionChunk):
                raise TypeError(f"unexpected chunk {type(chunk).__name__}")
            self.usage = chunk.usage or self.usage
            for choice in chunk.choices:
                for piece in _pieces(choice.delta):
                    yield piece
                self.finish = choice.finish_reason or self.finish


def _pieces(delta: dict[str, Any]) -> list[Piece]:
    out = []
    if delta.get("reasoning_content"):
        out.append(Piece("thinking", delta["reasoning_content"]))
    if delta.get("content"):
        out.append(Piece("text", delta["content"]))
    for call in delta.get("tool_calls") or []:
        function = call.get("function") or {}
        if call.get("id"):
            out.append(Piece("call", function.get("name", ""), call["id"]))
        if function.get("arguments"):
            out.append(Piece("arguments", function["arguments"]))
    return out


def stream_failure(exc: Exception, stream_id: str) -> APIError:
    """The error a stream that failed after its start reports: its own, or (logged) an
    internal error that shows nothing of it."""
    if isinstance(exc, APIError):
        return exc
    log.exception("stream_failed id=%s", stream_id, exc_info=exc)
    return internal_error()


def usage_of(flow: RequestFlow, output: OutputProcessor) -> Usage:
    return make_usage(len(flow.request.prompt_ids), output.num_tokens, flow.num_cached_tokens)


async def sse_events(
    flow: RequestFlow, output: OutputProcessor, fmt: Formatter, include_usage: bool
) -> AsyncIterator[bytes]:
    """Chunks as tokens arrive, the usage chunk if asked, then `[DONE]`.

    A failure after the stream started becomes an error event (`data: {"error": ...}`)
    followed by `[DONE]`.
    """
    try:
        async with aclosing(chat_chunks(flow, output, fmt, include_usage)) as chunks:
            async for chunk in chunks:
                yield sse(chunk, include_usage)
    except APIError as err:
        yield sse(err.body())
    except Exception:
        log.exception("stream_failed id=%s", flow.request.request_id)
        yield sse(internal_error().body())
    yield DONE


async def chat_chunks(
    flow: RequestFlow, output: OutputProcessor, fmt: Formatter, include_usage: bool
) -> AsyncGenerator[BaseModel, None]:
    """The stream's chunks as tokens arrive, then the usage chunk if asked; a failure raises."""
    first = True
    async with aclosing(flow.events()) as events:
        async for chunk in events:
            delta = output.feed(chunk)
            pieces = list(chunks_of(fmt.chunk(delta, first)))
            if delta.text:  # handed to the server next: the client's TTFT / TPOT marks
                flow.trail.sent_text()
            for one in pieces:
                first = False
                yield one
            if delta.finish_reason is not None:
                break
    if include_usage:
        yield fmt.usage_chunk(usage_of(flow, output))


async def collect(flow: RequestFlow, output: OutputProcessor) -> list[TextDelta]:
    """The whole generation, for a non-streaming answer."""
    deltas = []
    async with aclosing(flow.events()) as events:
        async for chunk in events:
            deltas.append(output.feed(chunk))
            if deltas[-1].text:
                flow.trail.sent_text()
            if deltas[-1].finish_reason is not None:
                break
    return deltas


class EventStreamResponse(StreamingResponse):
    """A text/event-stream response that awaits `on_close` when the stream ends, fails, or
    the client goes away (shielded from the cancellation that a disconnect causes)."""

    def __init__(
        self, content: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]]
    ) -> None:
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)
        self._content = content
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                aclose = getattr(self._content, "aclose", None)
                if aclose is not None:
                    await aclose()
                await self._on_close()
