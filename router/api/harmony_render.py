"""A chat conversation as a harmony prompt (gpt-oss's format), rendered by the router.

Every message is `<|start|>{header}<|message|>{content}<|end|>`:
- a `system` message of harmony's own (identity, knowledge cutoff, today's date, the
  reasoning effort, the valid channels and, with tools, that calls go to `commentary`);
- a `developer` message: the client's system and developer messages as `# Instructions`,
  then the tools as a TypeScript-like `functions` namespace (router.api.harmony_tools);
- `user` messages as they are;
- an assistant's reasoning on the `analysis` channel (only after the last user message:
  the thinking of finished turns is dropped, that of the turn being answered is kept, as
  the format asks), its content on `final` (on `commentary` as a preamble when it calls
  tools), each call on `commentary` to `functions.NAME` with `<|constrain|>json`, ending in
  `<|call|>`;
- a tool's result from `functions.NAME` (the call its `tool_call_id` names, else its
  `name`) to the assistant on `commentary`;
- and the generation prompt `<|start|>assistant`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from router.api.harmony_tools import functions_namespace
from router.api.requests import ChatMessage, ToolDefinition

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CALL, RETURN, CONSTRAIN = "<|call|>", "<|return|>", "<|constrain|>"
EFFORTS = ("low", "medium", "high")
IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."
KNOWLEDGE_CUTOFF = "2024-06"


@dataclass(frozen=True)
class HarmonyPrompt:
    """What the prompt holds besides the messages."""

    tools: Sequence[ToolDefinition] = ()
    instructions: str | None = None  # appended to the developer's (a response format's)
    effort: str = "medium"
    today: str = "2025-01-01"  # Current date, YYYY-MM-DD

    def __post_init__(self) -> None:
        if self.effort not in EFFORTS:
            raise ValueError(f"effort must be one of {', '.join(EFFORTS)}, got {self.effort!r}")


def render_harmony(messages: Sequence[ChatMessage], prompt: HarmonyPrompt) -> str:
    """The harmony prompt text; ValueError naming the message that cannot be rendered."""
    parts = [_message("system", _system(prompt))]
    developer = _developer(messages, prompt)
    if developer:
        parts.append(_message("developer", developer))
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    calls: dict[str, str] = {}  # tool call id -> function name
    for i, message in enumerate(messages):
        parts.extend(_turn(i, message, i > last_user, calls))
    parts.append(START + "assistant")
    return "".join(parts)


def _system(prompt: HarmonyPrompt) -> str:
    lines = [
        IDENTITY,
        f"Knowledge cutoff: {KNOWLEDGE_CUTOFF}",
        f"Current date: {prompt.today}",
        "",
        f"Reasoning: {prompt.effort}",
        "",
        "# Valid channels: analysis, commentary, final. Channel must be included for every "
        "message.",
    ]
    if prompt.tools:
        lines.append("Calls to these tools must go to the commentary channel: 'functions'.")
    return "\n".join(lines)


def _developer(messages: Sequence[ChatMessage], prompt: HarmonyPrompt) -> str:
    given = [m.text() for m in messages if m.role in ("system", "developer")]
    texts = [t for t in [*given, prompt.instructions] if t]
    sections = ["# Instructions\n\n" + "\n\n".join(texts)] if texts else []
    if prompt.tools:
        sections.append(f"# Tools\n\n{functions_namespace(prompt.tools)}")
    return "\n\n".join(sections)


def _turn(i: int, message: ChatMessage, current: bool, calls: dict[str, str]) -> list[str]:
    if message.role == "user":
        return [_message("user", message.text())]
    if message.role == "assistant":
        return _assistant(message, current, calls)
    if message.role == "tool":
        name = calls.get(message.tool_call_id or "", message.name)
        if not name:
            raise ValueError(
                f"messages[{i}].tool_call_id {message.tool_call_id!r} names no earlier tool call"
            )
        return [_message(f"functions.{name} to=assistant", message.text(), "commentary")]
    return []  # system and developer: in the developer message


def _assistant(message: ChatMessage, current: bool, calls: dict[str, str]) -> list[str]:
    out = []
    reasoning = message.reasoning_content or message.reasoning
    if reasoning and current:
        out.append(_message("assistant", reasoning, "analysis"))
    text = message.text()
    if text:
        out.append(_message("assistant", text, "commentary" if message.tool_calls else "final"))
    for call in message.tool_calls or []:
        calls[call.id] = call.function.name
        header = f"assistant{CHANNEL}commentary to=functions.{call.function.name} {CONSTRAIN}json"
        out.append(START + header + MESSAGE + _arguments(call.function.arguments) + CALL)
    return out


def _arguments(text: str) -> str:
    """A call's arguments as the model writes them: compact JSON (kept as sent if no JSON)."""
    try:
        return json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":"))
    except json.JSONDecodeError:
        return text


def _message(author: str, content: str, channel: str | None = None) -> str:
    header = author if channel is None else f"{author}{CHANNEL}{channel}"
    return f"{START}{header}{MESSAGE}{content}{END}"
