"""Reading a model's tool calls out of its output text: one parser per call format.

The names follow vLLM's `--tool-call-parser`:
- `hermes`: Qwen2.5 / Qwen3 (and Hermes) models write each call as
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, possibly several.
- `mistral`: Mistral's `[TOOL_CALLS]` followed by a JSON array of call objects. The control
  token itself is dropped by detokenization, so an output that is only such an array (after an
  optional `[TOOL_CALLS]`) is read as the calls.
- `openai`: gpt-oss's harmony messages to `functions.NAME`, as router.api.harmony writes
  them into the answer: `<|start|>functions<|message|>{"name": ..., "arguments": ...}<|call|>`.
- `json`: splitserve's own format, the one its tool prompt asks for when the chat template
  does not render tools: calls in `<tool_call>` tags, or one bare call object.

The text before the first call is the answer's content. An output whose calls do not parse
(malformed JSON, an unknown function, arguments that are not an object) is no call: it all
stays content. `auto` picks the parser by what the chat template writes (`parser_for`).
"""

from __future__ import annotations

import json
import re
import secrets
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MISTRAL_MARK = "[TOOL_CALLS]"
OPENAI_OPEN, OPENAI_CLOSE = "<|start|>functions<|message|>", "<|call|>"
_ALNUM = string.ascii_letters + string.digits
_UNREADABLE = (json.JSONDecodeError, RecursionError)  # nested past json's limit: no call

ParserName = Literal["auto", "json", "hermes", "mistral", "openai"]
PARSER_NAMES: tuple[ParserName, ...] = ("auto", "json", "hermes", "mistral", "openai")


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # compact JSON text


@dataclass(frozen=True)
class ParsedOutput:
    """An output that holds calls: the text before them (None when blank) and the calls."""

    content: str | None
    calls: list[ParsedCall]


@dataclass(frozen=True)
class ToolParser:
    name: str
    parse: Callable[[str, frozenset[str]], ParsedOutput | None]
    new_call_id: Callable[[], str]


def parser_for(setting: str, chat_template: str | None, harmony: bool = False) -> ToolParser:
    """The parser a setting names; `auto`: by the call format the chat template writes.
    Output read as `harmony` has its calls read by `openai`, whatever the setting."""
    if harmony:
        setting = "openai"
    elif setting == "auto":
        template = chat_template or ""
        if MISTRAL_MARK in template:
            setting = "mistral"
        elif OPEN in template:
            setting = "hermes"
        else:
            setting = "json"
    try:
        return PARSERS[setting]
    except KeyError:
        raise ValueError(
            f"unknown tool call parser {setting!r} (known: {', '.join(PARSER_NAMES)})"
        ) from None


def parse_bare_call(text: str, names: frozenset[str]) -> ParsedCall | None:
    """One call object as the whole text (what a forced call's grammar makes), or None."""
    stripped = text.strip()
    return _call(stripped, names) if stripped.startswith("{") else None


def _tagged(opener: str, closer: str) -> Callable[[str, frozenset[str]], ParsedOutput | None]:
    """The parser of calls each wrapped in `opener` ... `closer`."""
    # a call ends at its closer, or at the end of the output (a last one left open)
    wrapped = re.compile(
        re.escape(opener) + r"\s*(.*?)\s*(?:" + re.escape(closer) + "|$)", re.DOTALL
    )

    def parse(text: str, names: frozenset[str]) -> ParsedOutput | None:
        start = text.find(opener)
        if start < 0:
            return None
        calls = [_call(body, names) for body in wrapped.findall(text, start)]
        if not calls or any(c is None for c in calls):
            return None
        return ParsedOutput(text[:start].strip() or None, [c for c in calls if c is not None])

    return parse


_hermes = _tagged(OPEN, CLOSE)


def _json(text: str, names: frozenset[str]) -> ParsedOutput | None:
    wrapped = _hermes(text, names)
    if wrapped is not None or OPEN in text:
        return wrapped
    call = parse_bare_call(text, names)
    return ParsedOutput(None, [call]) if call is not None else None


def _mistral(text: str, names: frozenset[str]) -> ParsedOutput | None:
    start = text.find(MISTRAL_MARK)
    head, body = (text[:start], text[start + len(MISTRAL_MARK) :]) if start >= 0 else ("", text)
    try:
        values = json.loads(body)
    except _UNREADABLE:
        return None
    values = [values] if isinstance(values, dict) else values
    if not isinstance(values, list) or not values:
        return None
    calls = [_value_call(v, names) for v in values]
    if any(c is None for c in calls):
        return None
    return ParsedOutput(head.strip() or None, [c for c in calls if c is not None])


def _call(body: str, names: frozenset[str]) -> ParsedCall | None:
    try:
        return _value_call(json.loads(body), names)
    except _UNREADABLE:
        return None


def _value_call(value: Any, names: frozenset[str]) -> ParsedCall | None:
    if not isinstance(value, dict) or not isinstance(name := value.get("name"), str):
        return None
    if name not in names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except _UNREADABLE:
            return None
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(name, dumps(arguments))


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def openai_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def mistral_call_id() -> str:
    """Mistral's templates refuse a call id that is not 9 letters and digits."""
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


PARSERS = {
    "json": ToolParser("json", _json, openai_call_id),
    "hermes": ToolParser("hermes", _hermes, openai_call_id),
    "mistral": ToolParser("mistral", _mistral, mistral_call_id),
    "openai": ToolParser("openai", _tagged(OPENAI_OPEN, OPENAI_CLOSE), openai_call_id),
}
