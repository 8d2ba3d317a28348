"""The Responses API's request and its conversion to a chat completion request.

`input` (a text, or items: messages, function calls, their outputs, reasoning) and
`instructions` become chat messages; `tools`, `tool_choice`, `text.format`, the sampling
fields and `max_output_tokens` become their Chat Completions counterparts, so the rest runs
the chat path: the same prompt rendering, tool parsing and grammars. What the router does not
serve (built-in tools, background mode, stored prompts, conversations) is a 400 naming the
field, not ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from router.api.requests import FUNCTION_NAME, ChatCompletionRequest, SamplingFields, _Request
from router.errors import bad_request

# fields of OpenAI's request the router does not serve, refused when set
UNSERVED = ("background", "conversation", "prompt", "include", "max_tool_calls", "top_logprobs")
_TEXT_PARTS = ("input_text", "output_text", "text")


class ContentPart(_Request):
    type: str  # input_text / output_text; anything else is refused, naming it
    text: str | None = None


class InputItem(_Request):
    """A message, a function call, its output, or a reasoning item (`type` decides)."""

    type: str = "message"
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: str | list[ContentPart] | None = None
    call_id: str | None = Field(default=None, min_length=1, max_length=256)
    name: str | None = Field(default=None, pattern=FUNCTION_NAME)
    arguments: str | None = None
    output: str | None = None
    id: str | None = None
    summary: list[ContentPart] | None = None


class FunctionTool(_Request):
    type: str  # "function"; built-in tools (web_search, ...) are refused naming it
    name: str | None = Field(default=None, pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(_Request):
    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME)


class TextFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(default=None, pattern=FUNCTION_NAME)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextOptions(_Request):
    format: TextFormat | None = None


class ResponsesRequest(SamplingFields):
    """POST /v1/responses (and the sampling fields of chat completions)."""

    input: str | list[InputItem]
    instructions: str | None = None
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=128)
    store: bool = True
    max_output_tokens: int | None = Field(default=None, ge=1)
    tools: list[FunctionTool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    include: list[str] | None = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None
    truncation: Literal["auto", "disabled"] | None = None
    chat_template_kwargs: dict[str, Any] | None = Field(default=None, max_length=32)

    def refuse_unserved(self) -> None:
        """400 naming the first field set that the router does not serve."""
        for name in UNSERVED:
            if getattr(self, name) not in (None, False, []):
                raise bad_request(f"'{name}' is not supported by this server", param=name)
        if self.truncation == "auto":
            raise bad_request("truncation 'auto' is not supported", param="truncation")
        for i, tool in enumerate(self.tools or []):
            if tool.type != "function":
                raise bad_request(
                    f"tool type '{tool.type}' is not supported (only 'function')",
                    param=f"tools[{i}].type",
                )
            if tool.name is None:
                raise bad_request("a function tool needs its name", param=f"tools[{i}].name")


_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
             "frequency_penalty", "repetition_penalty", "chat_template_kwargs", "priority",
             "timeout", "parallel_tool_calls", "user", "stream")  # fmt: skip


def chat_request(req: ResponsesRequest, items: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat completion request of `req`, whose whole input (earlier turns included) is
    `items` (input item dicts, as `input_items` makes them)."""
    body: dict[str, Any] = {k: getattr(req, k) for k in _SAMPLING if getattr(req, k) is not None}
    body |= {"model": req.model, "messages": chat_messages(req.instructions, items)}
    if req.stream:
        body["stream_options"] = {"include_usage": True}
    if req.max_output_tokens is not None:
        body["max_completion_tokens"] = req.max_output_tokens
    if req.tools:
        body["tools"] = [_chat_tool(t) for t in req.tools]
    if req.tool_choice is not None:
        choice = req.tool_choice
        body["tool_choice"] = (
            choice
            if isinstance(choice, str)
            else {"type": "function", "function": {"name": choice.name}}
        )
    if req.text is not None and req.text.format is not None:
        body["response_format"] = _response_format(req.text.format)
    return ChatCompletionRequest.model_validate(body, strict=False)


def input_items(req: ResponsesRequest) -> list[dict[str, Any]]:
    """This request's input as item dicts (a text input: one user message)."""
    if isinstance(req.input, str):
        return [{"type": "message", "role": "user", "content": req.input}]
    return [item.model_dump(exclude_none=True, by_alias=True) for item in req.input]


def chat_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages of the input items (400 naming the item for what cannot be one)."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    calls: set[str] = set()
    thinking: str | None = None
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "reasoning":
            thinking = _text_of(item.get("content") or item.get("summary") or [], f"input[{i}]")
        elif kind == "message":
            messages.append(_message(item, i, thinking))
            thinking = None
        elif kind == "function_call":
            _add_call(messages, item, i, thinking)
            calls.add(item["call_id"])
            thinking = None
        elif kind == "function_call_output":
            if item.get("call_id") not in calls:
                raise bad_request(
                    f"no function_call with call_id {item.get('call_id')!r} precedes this output",
                    param=f"input[{i}].call_id",
                )
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": item.get("output") or ""})  # fmt: skip
        else:
            raise bad_request(
                f"input item type '{kind}' is not supported", param=f"input[{i}].type"
            )
    return messages


def _message(item: dict[str, Any], i: int, thinking: str | None) -> dict[str, Any]:
    role = item.get("role")
    if role is None:
        raise bad_request("a message item needs its role", param=f"input[{i}].role")
    content = item.get("content")
    text = content if isinstance(content, str) else _text_of(content or [], f"input[{i}].content")
    message = {"role": role, "content": text}
    if role == "assistant" and thinking:
        message["reasoning_content"] = thinking
    return message


def _add_call(
    messages: list[dict[str, Any]], item: dict[str, Any], i: int, thinking: str | None
) -> None:
    for field in ("call_id", "name", "arguments"):
        if item.get(field) is None:
            raise bad_request(f"a function_call item needs '{field}'", param=f"input[{i}].{field}")
    call = {"id": item["call_id"], "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]}}  # fmt: skip
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and "tool_calls" in last:
        last["tool_calls"].append(call)
        return
    message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
    if thinking:
        message["reasoning_content"] = thinking
    messages.append(message)


def _text_of(parts: list[dict[str, Any]], param: str) -> str:
    texts = []
    for k, part in enumerate(parts):
        if part.get("type") not in (*_TEXT_PARTS, "reasoning_text", "summary_text"):
            raise bad_request(
                f"content part type '{part.get('type')}' is not supported (text only)",
                param=f"{param}[{k}].type",
            )
        texts.append(part.get("text") or "")
    return "\n".join(texts)


def _chat_tool(tool: FunctionTool) -> dict[str, Any]:
    function = {"name": tool.name, "description": tool.description,
                "parameters": tool.parameters, "strict": tool.strict}  # fmt: skip
    return {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}


def _response_format(fmt: TextFormat) -> dict[str, Any]:
    if fmt.type != "json_schema":
        return {"type": fmt.type}
    if fmt.name is None:
        raise bad_request("a json_schema format needs its name", param="text.format.name")
    schema = {"name": fmt.name, "description": fmt.description, "schema": fmt.schema_,
              "strict": fmt.strict}  # fmt: skip
    return {
        "type": "json_schema",
        "json_schema": {k: v for k, v in schema.items() if v is not None},
    }
