"""Chat templates of HF model directories, rendered without torch or transformers.

The template is rendered in a jinja2 sandbox configured like transformers' (trim_blocks,
lstrip_blocks, loop controls, `raise_exception`, `strftime_now`, `dict`, a non-escaping
`tojson` with its keyword arguments, `namespace`, the `{% generation %}` tag), and messages
reach it as transformers passes them (None fields dropped, a message's reasoning under
`reasoning_content` and `thinking` both), so the router makes the same prompt text as
transformers does. Extra template variables (Qwen3's `enable_thinking`) come as `variables`.
"""

from __future__ import annotations

import functools
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
RESERVED = frozenset({"messages", "tools", "documents", "add_generation_prompt"})
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # the first is standard
# What a template may raise on input it does not expect (a number where text goes, a
# missing index): the conversation is refused, not the server.
_RENDER_ERRORS = (jinja2.TemplateError, TypeError, ValueError, LookupError, AttributeError)


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
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text of `messages` (OpenAI-style dicts); ValueError on bad messages.
        `tools`: OpenAI tool definitions, for a template that renders them. `variables`:
        more template variables (e.g. enable_thinking); they override special tokens, as
        transformers' keyword arguments do, but never the names in RESERVED."""
        chat = _check_messages(messages)
        extra = dict(variables or {})
        clash = sorted(RESERVED.intersection(extra))
        if clash:
            raise ValueError(f"template variable {clash[0]!r} is set by the server")
        template = self._template()
        try:
            return template.render(
                messages=chat,
                tools=list(tools) if tools else None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **{**special_tokens, **extra},
            )
        except _RENDER_ERRORS as exc:
            raise ValueError(f"chat template rejected the messages: {exc}") from None

    @functools.cached_property
    def uses_tools(self) -> bool:
        """True when the template reads the `tools` variable (renders tool definitions).
        Found once: parsing the template took 1.7 ms, on the router's event loop, for every
        chat request (SmolLM2's template, 2-core Xeon)."""
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
        clean = _alias_reasoning({k: v for k, v in message.items() if v is not None})
        if "content" in clean:
            clean["content"] = _content_text(clean["content"], i)
        elif not clean.get("tool_calls"):
            raise ValueError(f"messages[{i}].content is missing")
        chat.append(clean)
    return chat


def _alias_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    """The reasoning of a message under both names templates read (Qwen3: reasoning_content;
    others: thinking), whichever name the client used, as transformers does."""
    reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


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

    def __init__(*args: Any, **kwargs: Any) -> None:  # `self` may be a keyword: namespace(self=1)
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check_attribute(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_attribute(name)
        super().__setitem__(name, value)


def _check_attribute(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")


class _TemplateDict:
    """`dict(...)` in a template: builds plain dicts, exposes nothing else of the type."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args)


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
    env.globals["dict"] = _TemplateDict()
    return env
