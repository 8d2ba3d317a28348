"""Chat answers of a request that offers tools: `tool_calls` when the output is a call.

Streamed, the answer goes out as it is generated, read by `tool_stream.ToolStream`: the
text before the calls as content, then for each call one chunk with its index, id, type and
function name (arguments ""), then its arguments in pieces as they come, then an empty
delta with finish_reason "tool_calls". That finish reason says every call is whole: it is
given when the complete output parses as calls, as the non-streamed answer reads it. A call
that started but did not end as one (cut by max_tokens, bad JSON) ends the stream with the
generation's own finish reason. Output that is no call streams as content.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from router.api.objects import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ToolCallFunction,
    ToolCallOut,
    ToolCallsMessage,
)
from router.api.render import ChatFormatter, reasoning_of
from router.api.text_deltas import TextDelta
from router.api.tool_parsers import ParsedOutput, ToolParser
from router.api.tool_stream import CallStart, Content, Event, ToolStream, stream_for
from router.api.tools import ToolPlan, parse_tool_calls


@dataclass
class _Streamed:
    """One choice's stream: its reader, its text so far, deltas whose logprobs are unsent."""

    reader: ToolStream
    text: list[str] = field(default_factory=list)
    unsent: list[TextDelta] = field(default_factory=list)


class ToolChatFormatter(ChatFormatter):
    """ChatFormatter that turns output into tool calls when it is calls."""

    def __init__(self, plan: ToolPlan, parser: ToolParser, *args: Any) -> None:
        super().__init__(*args)
        self._plan = plan
        self._parser = parser
        self._streams: dict[int, _Streamed] = {}  # by choice index

    def chunk(  # type: ignore[override]
        self, delta: TextDelta, first: bool, index: int = 0
    ) -> list[ChatCompletionChunk] | None:
        streamed = self._streams.get(index)
        if streamed is None:
            streamed = self._streams[index] = _Streamed(stream_for(self._plan, self._parser))
        streamed.text.append(delta.text)
        streamed.unsent.append(delta)
        thinking = self._thinking(delta, first, index, streamed)
        first = first and not thinking
        events = streamed.reader.feed(delta.text)
        finish = delta.finish_reason
        if finish is not None:
            events += streamed.reader.finish()
        if finish is not None and not streamed.reader.calls:  # content, the last with finish
            text = "".join(e.text for e in events if isinstance(e, Content))
            return [*thinking, self._content(text, first, index, streamed, finish)]
        chunks = thinking + [
            self._event(e, first and i == 0, index, streamed) for i, e in enumerate(events)
        ]
        if finish is not None:
            whole = self._parsed(["".join(streamed.text)], finish)
            reason = "tool_calls" if whole is not None and streamed.reader.complete else finish
            chunks.append(self._chunk({}, reason, index, streamed))
        return chunks or None

    def _thinking(
        self, delta: TextDelta, first: bool, index: int, streamed: _Streamed
    ) -> list[ChatCompletionChunk]:
        """The chunk of the delta's thinking, if it has any."""
        if not delta.reasoning:
            return []
        head: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
        return [self._chunk(head | {"reasoning_content": delta.reasoning}, None, index, streamed)]

    def _event(
        self, event: Event, first: bool, index: int, streamed: _Streamed
    ) -> ChatCompletionChunk:
        if isinstance(event, Content):
            return self._content(event.text, first, index, streamed, None)
        delta: dict[str, Any] = {"role": "assistant", "content": None} if first else {}
        if isinstance(event, CallStart):
            call = {"index": event.index, "id": self._parser.new_call_id(), "type": "function",
                    "function": {"name": event.name, "arguments": ""}}  # fmt: skip
        else:
            call = {"index": event.index, "function": {"arguments": event.text}}
        delta["tool_calls"] = [call]
        return self._chunk(delta, None, index, streamed)

    def _content(
        self, text: str, first: bool, index: int, streamed: _Streamed, finish: str | None
    ) -> ChatCompletionChunk:
        logprobs = [lp for d in streamed.unsent for lp in d.logprobs or []] or None
        streamed.unsent.clear()
        chunk = super().chunk(TextDelta(text, [], logprobs, finish, 0), first, index)
        assert chunk is not None  # text, or the first chunk, or the last
        return chunk

    def _choice(self, deltas: Sequence[TextDelta], index: int) -> ChatChoice:
        finish = deltas[-1].finish_reason if deltas else None
        parsed = self._parsed([d.text for d in deltas], finish)
        if parsed is None:
            return super()._choice(deltas, index)
        message = ToolCallsMessage(
            content=parsed.content,
            reasoning_content=reasoning_of(deltas),
            tool_calls=[
                ToolCallOut(
                    id=self._parser.new_call_id(),
                    function=ToolCallFunction(name=c.name, arguments=c.arguments),
                )
                for c in parsed.calls
            ],
        )
        return ChatChoice(
            index=index,
            message=message,
            logprobs=self._logprobs(deltas),
            finish_reason="tool_calls",
        )

    def _parsed(self, texts: Sequence[str], finish: str | None) -> ParsedOutput | None:
        if finish != "stop":  # cut short (length, error): not a complete call
            return None
        return parse_tool_calls("".join(texts), self._plan, self._parser)

    def _chunk(
        self, delta: dict[str, Any], finish: str | None, index: int, streamed: _Streamed
    ) -> ChatCompletionChunk:
        """A chunk of `delta`, with the logprobs of the tokens not yet sent."""
        logprobs = self._logprobs(streamed.unsent)
        streamed.unsent.clear()
        choice = ChatChunkChoice(index=index, delta=delta, logprobs=logprobs, finish_reason=finish)
        return ChatCompletionChunk(
            id=self.request_id, created=self.created, model=self.model, choices=[choice]
        )
