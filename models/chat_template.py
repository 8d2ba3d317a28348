"""Chat templates of HF model directories, rendered without torch or transformers.

The template is rendered in a jinja2 sandbox configured like transformers' (trim_blocks,
lstrip_blocks, loop controls, `raise_exception`, `strftime_now`, a non-escaping `tojson`,
the `{% generation %}` tag), so the router makes the same prompt text as transformers does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


class ChatTemplate:
    """One model's chat template, compiled on first use."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._compiled: jinja2.Template | None = None

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool,
        special_tokens: Mapping[str, str],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """The prompt text of `messages` (OpenAI-style dicts); ValueError on bad messages.
        `tools`: OpenAI tool definitions, for a template that renders them."""
        chat = _check_messages(messages)
        try:
            return self._template().render(
                messages=chat,
                tools=list(tools) if tools else None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **special_tokens,
            )
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template rejected the messages: {exc}") from None

    @property
    def uses_tools(self) -> bool:
        """True when the template reads the `tools` variable (renders tool definitions)."""
        try:
            names = jinja2.meta.find_undeclared_variables(_environment().parse(self.text))
        except jinja2.TemplateError:
            return False
        return "tools" in names

    def _template(self) -> jinja2.Template:
        if self._compiled is None:
            try:
                self._compiled = _environment().from_string(self.text)
            except jinja2.TemplateError as exc:
                raise ValueError(f"chat template does not compile: {exc}") from None
        return self._compiled


def load_chat_template(path: Path, config: Mapping[str, Any]) -> str | None:
    """chat_template.jinja if present, else tokenizer_config's chat_template (str or named list)."""
    file = path / "chat_template.jinja"
    if file.is_file():
        try:
            return file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read {file}: {exc}") from None
    value = config.get("chat_template")
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, Mapping)}
        value = named.get("default")
    return value if isinstance(value, str) else None


def _check_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Validate chat messages; drop None fields and flatten text parts, as the template expects."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise ValueError("messages must be a non-empty list of {role, content} objects")
    chat = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"messages[{i}] must be an object with role and content")
        role = message.get("role")
        if role not in ROLES:
            shown = repr(role)[:40]  # the value is client input: keep it short
            raise ValueError(f"messages[{i}].role must be one of {sorted(ROLES)}, got {shown}")
        clean = {k: v for k, v in message.items() if v is not None}
        if "content" in clean:
            clean["content"] = _content_text(clean["content"], i)
        elif not clean.get("tool_calls"):
            raise ValueError(f"messages[{i}].content is missing")
        chat.append(clean)
    return chat


def _content_text(content: object, index: int) -> str:
    """A message's content as one string: text parts are joined with newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            p.get("text") for p in content if isinstance(p, Mapping) and p.get("type") == "text"
        ]
        if len(texts) == len(content) and all(isinstance(t, str) for t in texts):
            return "\n".join(str(t) for t in texts)
    raise ValueError(
        f"messages[{index}].content must be a string or a list of text parts, "
        f"got {type(content).__name__}"
    )


class _SafeNamespace(jinja2.utils.Namespace):
    """Jinja's namespace() that refuses underscore attributes (no reaching into internals)."""

    def __setitem__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")
        super().__setitem__(name, value)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (assistant-mask marker): renders its body."""

    tags = {"generation"}  # noqa: RUF012 (jinja reads the class attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _SafeNamespace
    return env
