"""The Messages API's request and its conversion to a chat completion request.

`system` and `messages` (text, `tool_use`, `tool_result` and `thinking` blocks) become chat
messages; `tools`, `tool_choice`, `max_tokens`, `stop_sequences` and the sampling fields
become their Chat Completions counterparts, so the rest runs the chat path: the same prompt
rendering, tool parsing and grammars. What the router does not serve (images, documents,
server tools, MCP servers) is a 400 naming the field, not ignored.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, field_validator

from router.api.requests import (
    FUNCTION_NAME,
    ChatCompletionRequest,
    SamplingFields,
    _Request,
    check_stops,
)
from router.errors import bad_request

UNSERVED = ("mcp_servers", "container")  # request fields refused when set
_SKIPPED_BLOCKS = ("redacted_thinking",)  # assistant blocks the prompt leaves out
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


class TextBlock(_Request):
    type: str  # "text"; anything else is refused, naming it
    text: str | None = None


class ContentBlock(_Request):
    """A text, `tool_use`, `tool_result` or `thinking` block (`type` decides)."""

    type: str
    text: str | None = None
    id: str | None = Field(default=None, min_length=1, max_length=256)
    name: str | None = Field(default=None, pattern=FUNCTION_NAME)
    input: dict[str, Any] | None = None
    tool_use_id: str | None = Field(default=None, min_length=1, max_length=256)
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None
    thinking: str | None = None
    signature: str | None = None


class InputMessage(_Request):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class Tool(_Request):
    type: str | None = None  # "custom" (or absent); server tools are refused naming it
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class ToolChoice(_Request):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(default=None, pattern=FUNCTION_NAME)
    disable_parallel_tool_use: bool | None = None


class Thinking(_Request):
    """`enabled` and `disabled` set the template's enable_thinking; `adaptive` and
    `between_tools` leave the template's default."""

    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = Field(default=None, ge=1)


class CountTokensRequest(_Request):
    """POST /v1/messages/count_tokens: a conversation, its system prompt and tools."""

    model: str
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = Field(default=None, max_length=128)
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    chat_template_kwargs: dict[str, Any] | None = Field(default=None, max_length=32)
    mcp_servers: list[Any] | None = None
    container: Any = None

    def refuse_unserved(self) -> None:
        """400 naming the first field set that the router does not serve."""
        for name in UNSERVED:
            if getattr(self, name) not in (None, []):
                raise bad_request(f"'{name}' is not supported by this server", param=name)
        for i, tool in enumerate(self.tools or []):
            if tool.type not in (None, "custom"):
                raise bad_request(
                    f"tool type '{tool.type}' is not supported (only custom tools)",
                    param=f"tools[{i}].type",
                )
        choice = self.tool_choice
        if choice is not None and choice.type == "tool" and choice.name is None:
            raise bad_request("tool_choice of type 'tool' needs its name", param="tool_choice.name")


class MessagesRequest(SamplingFields, CountTokensRequest):
    """POST /v1/messages."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    metadata: dict[str, Any] | None = Field(default=None, max_length=16)

    @field_validator("stop_sequences")
    @classmethod
    def _stops_are_short_and_nonempty(cls, value: list[str] | None) -> list[str] | None:
        check_stops(value)
        return value


def chat_request(req: CountTokensRequest) -> ChatCompletionRequest:
    """The chat completion request of `req` (a count_tokens request: its prompt alone)."""
    body: dict[str, Any] = {"model": req.model, "messages": chat_messages(req)}
    if req.messages and req.messages[-1].role == "assistant":  # a prefill: the answer goes on
        body["continue_final_message"] = True
    if req.tools:
        body["tools"] = [_chat_tool(t) for t in req.tools]
    choice = req.tool_choice
    if choice is not None:
        body["tool_choice"] = _CHOICES.get(choice.type) or {
            "type": "function", "function": {"name": choice.name}
        }  # fmt: skip
        if choice.disable_parallel_tool_use:
            body["parallel_tool_calls"] = False
    kwargs = dict(req.chat_template_kwargs or {})
    if req.thinking is not None and req.thinking.type in ("enabled", "disabled"):
        kwargs["enable_thinking"] = req.thinking.type == "enabled"
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    if isinstance(req, MessagesRequest):
        body |= _sampling(req)
    return ChatCompletionRequest.model_validate(body, strict=False)


def _sampling(req: MessagesRequest) -> dict[str, Any]:
    fields = (name for name in SamplingFields.model_fields if name != "model")
    body = {name: value for name in fields if (value := getattr(req, name)) is not None}
    body["max_tokens"] = req.max_tokens
    if req.stream:
        body["stream_options"] = {"include_usage": True}
    if req.stop_sequences:
        body["stop"] = req.stop_sequences
    user = (req.metadata or {}).get("user_id")
    if isinstance(user, str):
        body["user"] = user
    return body


def chat_messages(req: CountTokensRequest) -> list[dict[str, Any]]:
    """Chat messages of the system prompt and the messages (400 naming the block for what
    cannot be one, e.g. a tool_result whose tool_use is not in the message before)."""
    messages: list[dict[str, Any]] = []
    if req.system:
        system = req.system
        text = system if isinstance(system, str) else _text_of(system, "system")
        messages.append({"role": "system", "content": text})
    calls: set[str] = set()  # tool_use ids of the assistant message before
    for i, message in enumerate(req.messages):
        content = message.content
        blocks = [ContentBlock(type="text", text=content)] if isinstance(content, str) else content
        where = f"messages[{i}].content"
        if message.role == "assistant":
            messages.append(_assistant(blocks, where))
            calls = {call["id"] for call in messages[-1].get("tool_calls", [])}
        else:
            messages += _user(blocks, where, calls)
            calls = set()
    return messages


def _assistant(blocks: list[ContentBlock], where: str) -> dict[str, Any]:
    texts, thinking, tool_calls = [], [], []
    for k, block in enumerate(blocks):
        if block.type == "text":
            texts.append(block.text or "")
        elif block.type == "thinking":
            thinking.append(block.thinking or "")
        elif block.type == "tool_use":
            for name in ("id", "name"):
                if getattr(block, name) is None:
                    raise bad_request(f"a tool_use block needs '{name}'", f"{where}[{k}].{name}")
            arguments = json.dumps(block.input or {}, ensure_ascii=False)
            function = {"name": block.name, "arguments": arguments}
            tool_calls.append({"id": block.id, "type": "function", "function": function})
        elif block.type not in _SKIPPED_BLOCKS:
            raise _unsupported(block.type, f"{where}[{k}].type")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    if tool_calls:
        message["tool_calls"] = tool_calls
        message["content"] = message["content"] or None
    return message


def _user(blocks: list[ContentBlock], where: str, calls: set[str]) -> list[dict[str, Any]]:
    results, texts = [], []
    for k, block in enumerate(blocks):
        if block.type == "text":
            texts.append(block.text or "")
        elif block.type == "tool_result":
            if block.tool_use_id not in calls:
                raise bad_request(
                    f"tool_result block's tool_use_id {block.tool_use_id!r} has no tool_use block "
                    "in the assistant message before",
                    param=f"{where}[{k}].tool_use_id",
                )
            content = block.content
            text = (
                content
                if isinstance(content, str)
                else _text_of(content or [], f"{where}[{k}].content")
            )
            results.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": text})
        else:
            raise _unsupported(block.type, f"{where}[{k}].type")
    return results + ([{"role": "user", "content": "\n".join(texts)}] if texts else [])


def _text_of(blocks: list[TextBlock], where: str) -> str:
    for k, block in enumerate(blocks):
        if block.type != "text":
            raise _unsupported(block.type, f"{where}[{k}].type")
    return "\n".join(block.text or "" for block in blocks)


def _unsupported(kind: str, param: str) -> Exception:
    return bad_request(f"content block type '{kind}' is not supported here", param=param)


def _chat_tool(tool: Tool) -> dict[str, Any]:
    function = {"name": tool.name, "description": tool.description,
                "parameters": tool.input_schema}  # fmt: skip
    return {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}
