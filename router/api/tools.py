"""Tool calls: checking tool definitions, putting them in the prompt, and reading calls back.

A chat template that uses the `tools` variable (transformers' convention) renders the tool
definitions itself. Otherwise (the default model's template among them) the router puts them
in a system message, with the instruction to answer a call as one JSON object
`{"name": ..., "arguments": {...}}` inside `<tool_call>` ... `</tool_call>`. Earlier calls in
the conversation (assistant `tool_calls`) are written back in that same wrapper, and tool
results go in as `tool` messages.

`tool_choice`: "none" renders no tools; "auto" lets the model choose (calls are read from the
output in the format of the model's template: router.api.tool_parsers); "required" and a
named function constrain the output with a grammar built from the functions' parameter
schemas, closed and bounded (router.api.tool_schema), so that it always parses: a bare
`{"name": ..., "arguments": {...}}` object. A forced call that `max_tokens` cuts short is no
call: it ends with finish_reason "length" and the text so far as content (router.api.tool_answers).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from router.api.requests import ChatCompletionRequest, ChatMessage, ToolDefinition
from router.api.structured import json_schema_grammar
from router.api.tool_parsers import (
    CLOSE,
    OPEN,
    ParsedOutput,
    ToolParser,
    parse_bare_call,
)
from router.api.tool_parsers import dumps as _dumps
from router.api.tool_schema import closed_schema
from router.errors import bad_request

_ANY_OBJECT: dict[str, Any] = {"type": "object"}

Mode = Literal["auto", "required", "named"]


@dataclass(frozen=True)
class ToolPlan:
    """The tools a request offers the model, and how it must use them."""

    mode: Mode
    tools: tuple[ToolDefinition, ...]  # offered (a named choice offers only that function)
    grammar: str | None  # for "required" and "named"

    @property
    def names(self) -> frozenset[str]:
        return frozenset(t.function.name for t in self.tools)


def plan_tools(req: ChatCompletionRequest) -> ToolPlan | None:
    """Check `tools` and `tool_choice` (400 naming the parameter); None when no tool is
    offered (no tools, or tool_choice "none")."""
    tools, choice = req.tools or [], req.tool_choice
    if choice is not None and choice != "none" and not tools:
        raise bad_request("tool_choice needs tools", param="tool_choice", code="invalid_value")
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        name = tool.function.name
        if name in seen:
            raise bad_request(
                f"invalid 'tools[{i}].function.name': the function '{name}' is defined twice",
                param=f"tools[{i}].function.name",
            )
        seen.add(name)
        json_schema_grammar(_parameters(tool), f"tools[{i}].function.parameters")
    if not tools or choice == "none":
        return None
    if choice is None or choice == "auto":
        return ToolPlan("auto", tuple(tools), None)
    if choice == "required":
        offered = tuple(tools)
    else:
        offered = tuple(t for t in tools if t.function.name == choice.function.name)
        if not offered:
            raise bad_request(
                f"invalid 'tool_choice': no function named '{choice.function.name}' in tools",
                param="tool_choice",
            )
    if req.response_format is not None and req.response_format.type != "text":
        raise bad_request(
            "a forced tool call cannot be combined with a response_format",
            param="response_format",
        )
    grammar = json_schema_grammar(call_schema(offered), "tools")
    return ToolPlan("required" if choice == "required" else "named", offered, grammar)


def call_schema(tools: Sequence[ToolDefinition]) -> dict[str, Any]:
    """JSON schema of one call to one of `tools`: {"name": <const>, "arguments": <params>},
    the parameters closed and bounded for the grammar."""
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t.function.name},
                "arguments": closed_schema(_parameters(t)),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


def _parameters(tool: ToolDefinition) -> dict[str, Any]:
    params = tool.function.parameters
    return params if params else _ANY_OBJECT


# ---------------------------------------------------------------- the prompt


def template_messages(
    messages: Sequence[ChatMessage], plan: ToolPlan | None, native: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) for the chat template. `native`: the template renders `tools`."""
    if native:
        tools = [t.model_dump(exclude_none=True) for t in plan.tools] if plan else None
        return [_native_message(m) for m in messages], tools
    chat = [_fallback_message(m) for m in messages]
    if plan is not None:
        chat = with_system_text(chat, _tools_prompt(plan))
    return chat, None


def _native_message(message: ChatMessage) -> dict[str, Any]:
    out = message.template_dict()
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": _loads(c.function.arguments)},
            }
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def _fallback_message(message: ChatMessage) -> dict[str, Any]:
    out = message.template_dict()
    if message.tool_calls:
        calls = [
            OPEN
            + _dumps({"name": c.function.name, "arguments": _loads(c.function.arguments)})
            + CLOSE
            for c in message.tool_calls
        ]
        out["content"] = "\n".join(filter(None, [out["content"], *calls]))
    return out


def with_system_text(chat: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """`chat` with `text` added to its system message (a new one first when it has none)."""
    if chat and chat[0]["role"] in ("system", "developer"):
        first = dict(chat[0])
        first["content"] = f"{first['content']}\n\n{text}" if first["content"] else text
        return [first, *chat[1:]]
    return [{"role": "system", "content": text}, *chat]


def _tools_prompt(plan: ToolPlan) -> str:
    lines = ["You can call these functions (the JSON schema of each one's arguments):"]
    for t in plan.tools:
        spec = {"name": t.function.name, "parameters": _parameters(t)}
        if t.function.description:
            spec["description"] = t.function.description
        lines.append(_dumps(spec))
    if plan.mode == "auto":
        lines.append(
            f'To call a function, answer only {OPEN}{{"name": <function name>, "arguments": '
            f"{{<arguments>}}}}{CLOSE}; otherwise answer normally."
        )
    else:
        which = "one of these functions" if plan.mode == "required" else plan.tools[0].function.name
        lines.append(
            f'Call {which} now: answer only {{"name": <function name>, "arguments": '
            "{<arguments>}}."
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- reading calls back


def parse_tool_calls(text: str, plan: ToolPlan, parser: ToolParser) -> ParsedOutput | None:
    """The calls in a model's output, or None when it is no call (then it is content).
    A forced call is the bare object its grammar made; "auto" reads `parser`'s format."""
    if plan.mode != "auto":
        call = parse_bare_call(text, plan.names)
        return ParsedOutput(None, [call]) if call is not None else None
    return parser.parse(text, plan.names)


def _loads(text: str) -> Any:
    """Arguments as a client sent them: JSON text, kept as text when it does not parse."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
