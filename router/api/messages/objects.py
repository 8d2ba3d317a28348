"""The Messages API's answer objects: a message, its content blocks, usage, token counts.

Built from the chat completion the shared pipeline made (`message_of`), so thinking, text
and tool calls read the same as on Chat Completions.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import BaseModel

from router.api.objects import ChatCompletion, Usage

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]
_STOP_REASONS: dict[str | None, StopReason] = {"length": "max_tokens", "tool_calls": "tool_use"}


def new_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def stop_reason(finish_reason: str | None, stop: str | None) -> StopReason:
    """The Messages API's stop reason of a chat finish reason (`stop`: the stop sequence
    that ended the output, if one did)."""
    if stop is not None and finish_reason == "stop":
        return "stop_sequence"
    return _STOP_REASONS.get(finish_reason, "end_turn")


class TextOut(BaseModel):
    type: Literal["text"] = "text"
    text: str
    citations: None = None


class ThinkingOut(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""  # no signature: the thinking goes back to this server only


class ToolUseOut(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


ContentOut = TextOut | ThinkingOut | ToolUseOut


class MessageUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0

    @classmethod
    def of(cls, usage: Usage) -> MessageUsage:
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
        return cls(
            input_tokens=usage.prompt_tokens,
            output_tokens=usage.completion_tokens,
            cache_read_input_tokens=cached,
        )


class MessageObject(BaseModel):
    """A message (`type: "message"`), as answered, and as `message_start` streams it."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentOut]
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: MessageUsage


class TokenCount(BaseModel):
    input_tokens: int


def tool_input(arguments: str) -> dict[str, Any]:
    """A tool call's arguments (JSON text) as the tool_use block's input object."""
    value = json.loads(arguments) if arguments.strip() else {}
    return value if isinstance(value, dict) else {"arguments": value}


def message_of(completion: ChatCompletion, model: str, stop: str | None) -> MessageObject:
    """The message of a chat completion's first choice: thinking, text, tool calls; `stop`:
    the stop sequence that ended it, if one did."""
    choice = completion.choices[0]
    message = choice.message
    content: list[ContentOut] = []
    if message.reasoning_content:
        content.append(ThinkingOut(thinking=message.reasoning_content))
    if message.content:
        content.append(TextOut(text=message.content))
    calls = getattr(message, "tool_calls", None) or []
    content += [
        ToolUseOut(id=c.id, name=c.function.name, input=tool_input(c.function.arguments))
        for c in calls
    ]
    return MessageObject(
        id=new_id(),
        model=model,
        content=content,
        stop_reason=stop_reason(choice.finish_reason, stop),
        stop_sequence=stop if choice.finish_reason == "stop" else None,
        usage=MessageUsage.of(completion.usage),
    )
