"""Chat answers of a request that offers tools: `tool_calls` when the output is a call.

Whether the output is a call is known only once it is complete, so the text is held back and
sent when the generation ends, in the chunks OpenAI streams for a call: the text before the
calls as content (when there is any), one chunk with each call's index, id, type and function
name (arguments ""), one chunk per call with its arguments, then an empty delta with
finish_reason "tool_calls". Output that is no call is sent as content, with the finish reason
it had.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from router.api.objects import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ToolCallFunction,
    ToolCallOut,
    ToolCallsMessage,
)
from router.api.render import ChatFormatter
from router.api.text_deltas import TextDelta
from router.api.tool_parsers import ParsedOutput, ToolParser
from router.api.tools import ToolPlan, parse_tool_calls


class ToolChatFormatter(ChatFormatter):
    """ChatFormatter that turns a complete output into tool calls when it is one."""

    def __init__(self, plan: ToolPlan, parser: ToolParser, *args: Any) -> None:
        super().__init__(*args)
        self._plan = plan
        self._parser = parser
        self._held: dict[int, list[TextDelta]] = {}  # by choice index

    def chunk(  # type: ignore[override]
        self, delta: TextDelta, first: bool, index: int = 0
    ) -> list[ChatCompletionChunk] | None:
        held = self._held.setdefault(index, [])
        held.append(delta)
        if delta.finish_reason is None:
            return None
        parsed = self._parsed(held, delta.finish_reason)
        if parsed is None:
            whole = TextDelta(
                "".join(d.text for d in held),
                [t for d in held for t in d.token_ids],
                [lp for d in held for lp in d.logprobs or []] or None,
                delta.finish_reason,
                0,
            )
            piece = super().chunk(whole, True, index)
            return [piece] if piece is not None else None
        calls = parsed.calls
        heads = [
            {"index": i, "id": self._parser.new_call_id(), "type": "function",
             "function": {"name": c.name, "arguments": ""}}
            for i, c in enumerate(calls)
        ]  # fmt: skip
        said = [{"role": "assistant", "content": parsed.content}] if parsed.content else []
        opening: dict[str, Any] = {} if said else {"role": "assistant", "content": None}
        deltas: list[dict[str, Any]] = [
            *said,
            {**opening, "tool_calls": heads},
            *(
                {"tool_calls": [{"index": i, "function": {"arguments": c.arguments}}]}
                for i, c in enumerate(calls)
            ),
            {},
        ]
        reasons = [None] * (len(deltas) - 1) + ["tool_calls"]
        return [self._chunk(d, r, index) for d, r in zip(deltas, reasons, strict=True)]

    def _choice(self, deltas: Sequence[TextDelta], index: int) -> ChatChoice:
        finish = deltas[-1].finish_reason if deltas else None
        parsed = self._parsed(deltas, finish)
        if parsed is None:
            return super()._choice(deltas, index)
        message = ToolCallsMessage(
            content=parsed.content,
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

    def _parsed(self, deltas: Sequence[TextDelta], finish: str | None) -> ParsedOutput | None:
        if finish != "stop":  # cut short (length, error): not a complete call
            return None
        return parse_tool_calls("".join(d.text for d in deltas), self._plan, self._parser)

    def _chunk(self, delta: dict[str, Any], finish: str | None, index: int) -> ChatCompletionChunk:
        choice = ChatChunkChoice(index=index, delta=delta, finish_reason=finish)
        return ChatCompletionChunk(
            id=self.request_id, created=self.created, model=self.model, choices=[choice]
        )
