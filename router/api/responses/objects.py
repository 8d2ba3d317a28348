"""The Responses API's answer objects: a response, its output items, usage, stream events.

Built from the chat completion the shared pipeline made (`from_completion`), so reasoning,
text and tool calls read the same as on Chat Completions.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, Field

from router.api.objects import ChatCompletion, Usage

Status = Literal["completed", "incomplete", "in_progress", "cancelled", "failed"]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[dict[str, Any]] = Field(default_factory=list)
    logprobs: list[dict[str, Any]] = Field(default_factory=list)


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class MessageItem(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Status = "completed"
    content: list[OutputText]


class ReasoningItem(BaseModel):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[dict[str, Any]] = Field(default_factory=list)
    content: list[ReasoningText]
    status: Status = "completed"


class FunctionCallItem(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Status = "completed"


OutputItem = MessageItem | ReasoningItem | FunctionCallItem


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int

    @classmethod
    def of(cls, usage: Usage) -> ResponseUsage:
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
        return cls(
            input_tokens=usage.prompt_tokens,
            input_tokens_details=InputTokensDetails(cached_tokens=cached),
            output_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
        )


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseObject(BaseModel):
    """A response (`object: "response"`), as created, streamed last, stored and read back."""

    id: str
    object: Literal["response"] = "response"
    created_at: float = Field(default_factory=time.time)
    model: str
    status: Status
    output: list[OutputItem] = Field(default_factory=list)
    error: dict[str, Any] | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    parallel_tool_calls: bool = True
    tool_choice: Any = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    store: bool = True
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    usage: ResponseUsage | None = None


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: bool = True


def output_items(completion: ChatCompletion) -> list[OutputItem]:
    """The output items of a chat completion's first choice: thinking, text, calls."""
    message = completion.choices[0].message
    items: list[OutputItem] = []
    if message.reasoning_content:
        items.append(
            ReasoningItem(id=new_id("rs"), content=[ReasoningText(text=message.reasoning_content)])
        )
    calls = getattr(message, "tool_calls", None) or []
    if message.content or not calls:
        items.append(
            MessageItem(id=new_id("msg"), content=[OutputText(text=message.content or "")])
        )
    items += [
        FunctionCallItem(
            id=new_id("fc"), call_id=c.id, name=c.function.name, arguments=c.function.arguments
        )
        for c in calls
    ]
    return items


def finished(
    shell: ResponseObject, items: list[OutputItem], finish: str | None, usage: Usage | None
) -> ResponseObject:
    """`shell` (the response as created) completed with its output, or incomplete when the
    output hit max_output_tokens."""
    cut = finish == "length"
    return shell.model_copy(
        update={
            "status": "incomplete" if cut else "completed",
            "incomplete_details": IncompleteDetails(reason="max_output_tokens") if cut else None,
            "output": items,
            "usage": ResponseUsage.of(usage) if usage is not None else None,
        }
    )
