"""A streamed message: chat completion chunks turned into the Messages API's events.

`message_start` (the message with no content yet and the prompt's tokens) and a `ping`
first; then per content block (thinking, text, each tool call) `content_block_start`, its
`content_block_delta`s (`thinking_delta`, `text_delta`, `input_json_delta`) and
`content_block_stop`; last `message_delta` (the stop reason and the output tokens) and
`message_stop`. A failure after the start is an `error` event in Anthropic's error shape.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from pydantic import BaseModel

from router.api.messages.errors import anthropic_body
from router.api.messages.objects import (
    MessageObject,
    MessageUsage,
    TextOut,
    ThinkingOut,
    ToolUseOut,
    stop_reason,
)
from router.api.objects import Usage
from router.api.streaming import ChatDeltas, Piece, named_event, stream_failure

Kind = Literal["thinking", "text", "tool_use"]
_DELTAS: dict[Kind, tuple[str, str]] = {
    "thinking": ("thinking_delta", "thinking"),
    "text": ("text_delta", "text"),
    "tool_use": ("input_json_delta", "partial_json"),
}


class MessageEvents:
    """The events of one streamed message; `shell` is the message before its content, `stop`
    reads the stop sequence that ended the output."""

    def __init__(self, shell: MessageObject, stop: Callable[[], str | None]) -> None:
        self._shell = shell
        self._stop = stop  # the stop sequence that ended the output, once it ended
        self._index = -1  # of the open content block
        self._open: Kind | None = None

    async def stream(self, chunks: AsyncIterator[BaseModel]) -> AsyncIterator[bytes]:
        yield _event("message_start", message=self._shell)
        yield _event("ping")
        reader = ChatDeltas(chunks)
        try:
            async for piece in reader:
                for event in self._events(piece):
                    yield event
            for event in self._close():
                yield event
            yield self._end(reader.finish, reader.usage)
            yield _event("message_stop")
        except Exception as exc:
            yield named_event("error", anthropic_body(stream_failure(exc, self._shell.id)))

    def _events(self, piece: Piece) -> list[bytes]:
        if piece.kind == "call":
            block = ToolUseOut(id=piece.call_id, name=piece.text, input={})
            return self._start("tool_use", block)
        if piece.kind == "arguments":
            return self._piece("tool_use", piece.text) if self._open == "tool_use" else []
        return self._piece(piece.kind, piece.text)

    def _piece(self, kind: Kind, text: str) -> list[bytes]:
        events: list[bytes] = []
        if self._open != kind:
            block = ThinkingOut(thinking="") if kind == "thinking" else TextOut(text="")
            events = self._start(kind, block)
        name, key = _DELTAS[kind]
        delta = {"type": name, key: text}
        return [*events, _event("content_block_delta", index=self._index, delta=delta)]

    def _start(self, kind: Kind, block: BaseModel) -> list[bytes]:
        events = self._close()
        self._index += 1
        self._open = kind
        return [*events, _event("content_block_start", index=self._index, content_block=block)]

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        return [_event("content_block_stop", index=self._index)]

    def _end(self, finish: str | None, usage: Usage | None) -> bytes:
        stop = self._stop() if finish == "stop" else None
        delta = {"stop_reason": stop_reason(finish, stop), "stop_sequence": stop}
        tokens = MessageUsage.of(usage) if usage is not None else self._shell.usage
        return _event("message_delta", delta=delta, usage=tokens)


def _event(kind: str, **fields: Any) -> bytes:
    body = {"type": kind} | {
        k: v.model_dump(mode="json") if isinstance(v, BaseModel) else v for k, v in fields.items()
    }
    return named_event(kind, body)
