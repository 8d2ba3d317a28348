"""A streamed response: chat completion chunks turned into the Responses API's events.

`response.created` and `response.in_progress` first; then, per output item (thinking, text,
each function call), `response.output_item.added`, its deltas (`response.reasoning_text.delta`,
`response.output_text.delta` inside a content part, `response.function_call_arguments.delta`),
their `.done` events and `response.output_item.done`; last `response.completed` (or
`response.incomplete` when max_output_tokens cut the output) with the whole response. Every
event carries its `sequence_number`. A failure after the start is an `error` event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from router.api.responses.objects import (
    FunctionCallItem,
    MessageItem,
    OutputItem,
    OutputText,
    ReasoningItem,
    ReasoningText,
    ResponseObject,
    finished,
    new_id,
)
from router.api.streaming import ChatDeltas, Piece, named_event, stream_failure

Kind = Literal["reasoning", "message", "function_call"]


@dataclass
class _Open:
    """The output item being streamed."""

    kind: Kind
    id: str
    index: int
    text: list[str] = field(default_factory=list)
    call_id: str = ""
    name: str = ""


class ResponseEvents:
    """The events of one streamed response; `on_done` gets the final response (to store it)."""

    def __init__(
        self, shell: ResponseObject, on_done: Callable[[ResponseObject], Awaitable[None]]
    ) -> None:
        self._shell = shell
        self._on_done = on_done
        self._seq = 0
        self._items: list[OutputItem] = []
        self._open: _Open | None = None

    async def stream(self, chunks: AsyncIterator[BaseModel]) -> AsyncIterator[bytes]:
        yield self._event("response.created", response=self._shell)
        yield self._event("response.in_progress", response=self._shell)
        reader = ChatDeltas(chunks)
        try:
            async for piece in reader:
                for event in self._events(piece):
                    yield event
            for event in self._close():
                yield event
            final = finished(self._shell, self._items, reader.finish, reader.usage)
            await self._on_done(final)
            kind = "response.incomplete" if final.status == "incomplete" else "response.completed"
            yield self._event(kind, response=final)
        except Exception as exc:
            err = stream_failure(exc, self._shell.id)
            yield self._event("error", message=err.message, code=err.code, param=err.param)

    def _events(self, piece: Piece) -> list[bytes]:
        if piece.kind == "call":
            return self._start("function_call", piece.call_id, piece.text)
        if piece.kind == "text" or piece.kind == "thinking":
            return self._text("message" if piece.kind == "text" else "reasoning", piece.text)
        if self._open is None:
            return []
        self._open.text.append(piece.text)
        return [self._event("response.function_call_arguments.delta", item_id=self._open.id,
                            output_index=self._open.index, delta=piece.text)]  # fmt: skip

    def _text(self, kind: Kind, text: str) -> list[bytes]:
        events = [] if self._open is not None and self._open.kind == kind else self._start(kind)
        assert self._open is not None
        self._open.text.append(text)
        name = (
            "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        )
        extra: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
        events.append(self._event(name, item_id=self._open.id, output_index=self._open.index,
                                  content_index=0, delta=text, **extra))  # fmt: skip
        return events

    def _start(self, kind: Kind, call_id: str = "", name: str = "") -> list[bytes]:
        events = self._close()
        prefix = {"reasoning": "rs", "message": "msg", "function_call": "fc"}[kind]
        self._open = _Open(kind, new_id(prefix), len(self._items), call_id=call_id, name=name)
        item = self._item(self._open, "in_progress")
        events.append(
            self._event("response.output_item.added", output_index=self._open.index, item=item)
        )
        if kind == "message":
            where = {"item_id": self._open.id, "output_index": self._open.index}
            part = OutputText(text="")
            events.append(
                self._event("response.content_part.added", **where, content_index=0, part=part)
            )
        return events

    def _close(self) -> list[bytes]:
        opened, self._open = self._open, None
        if opened is None:
            return []
        text = "".join(opened.text)
        where = {"item_id": opened.id, "output_index": opened.index}
        events = []
        if opened.kind == "reasoning":
            events.append(
                self._event("response.reasoning_text.done", **where, content_index=0, text=text)
            )
        elif opened.kind == "message":
            events.append(
                self._event(
                    "response.output_text.done", **where, content_index=0, text=text, logprobs=[]
                )
            )
            events.append(self._event("response.content_part.done", **where, content_index=0,
                                      part=OutputText(text=text)))  # fmt: skip
        else:
            events.append(self._event("response.function_call_arguments.done", **where,
                                      name=opened.name, arguments=text))  # fmt: skip
        item = self._item(opened, "completed")
        self._items.append(item)
        events.append(
            self._event("response.output_item.done", output_index=opened.index, item=item)
        )
        return events

    @staticmethod
    def _item(opened: _Open, status: Literal["in_progress", "completed"]) -> OutputItem:
        text = "".join(opened.text)
        if opened.kind == "reasoning":
            return ReasoningItem(id=opened.id, content=[ReasoningText(text=text)], status=status)
        if opened.kind == "message":
            content = [OutputText(text=text)] if status == "completed" else []
            return MessageItem(id=opened.id, content=content, status=status)
        return FunctionCallItem(id=opened.id, call_id=opened.call_id, name=opened.name,
                                arguments=text, status=status)  # fmt: skip

    def _event(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, "sequence_number": self._seq}
        body |= {
            k: v.model_dump(mode="json") if isinstance(v, BaseModel) else v
            for k, v in fields.items()
        }
        self._seq += 1
        return named_event(kind, body)
