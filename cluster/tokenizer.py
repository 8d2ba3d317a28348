"""Tokenizer and chat template of a HF model directory, without torch or transformers.

The router tokenizes and detokenizes with this module, so it imports only `tokenizers` and
jinja2. It reproduces what transformers (5.x) AutoTokenizer does for tokenizer.json models:
encode / decode through the same Rust backend, and chat templates rendered in a sandbox
configured like transformers' (trim_blocks, lstrip_blocks, loop controls, `raise_exception`,
`strftime_now`, a non-escaping `tojson`), then encoded without extra special tokens.

BOS/EOS insertion: like transformers 5, tokenizer.json's post-processor alone decides;
`add_bos_token` / `add_eos_token` in tokenizer_config.json are ignored when tokenizer.json
exists (transformers 4's Llama tokenizers honoured them). `clean_up_tokenization_spaces` is
not applied (transformers 5 defaults it off; it corrupts BPE text).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as BackendTokenizer

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_SPECIAL_NAMES = ("bos", "eos", "unk", "pad", "sep", "cls", "mask")


class Tokenizer:
    """Text <-> token ids and chat rendering for one model directory."""

    def __init__(
        self,
        backend: BackendTokenizer,
        special_tokens: Mapping[str, str],
        eos_token_ids: frozenset[int],
        chat_template: str | None = None,
    ) -> None:
        """Prefer `from_dir`. special_tokens maps names like "eos_token" to token text."""
        self._backend = backend
        self.special_tokens: dict[str, str] = dict(special_tokens)
        self.eos_token_ids = eos_token_ids
        self.chat_template = chat_template
        self._template: jinja2.Template | None = None

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load tokenizer.json, tokenizer_config.json, the chat template and EOS ids of `path`."""
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise ValueError(f"tokenizer file {path / 'tokenizer.json'} is missing")
        try:
            backend = BackendTokenizer.from_file(str(path / "tokenizer.json"))
        except Exception as exc:  # the Rust loader raises plain Exception subclasses
            raise ValueError(f"cannot load {path / 'tokenizer.json'}: {exc}") from None
        config = _read_json(path / "tokenizer_config.json", required=True)
        special = {
            f"{name}_token": text
            for name in _SPECIAL_NAMES
            if (text := _token_text(config.get(f"{name}_token"))) is not None
        }
        eos_ids = _eos_ids(backend, special.get("eos_token"), path)
        return cls(backend, special, eos_ids, _chat_template(path, config))

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer knows, added tokens included."""
        return int(self._backend.get_vocab_size(with_added_tokens=True))

    def token_id(self, name: str) -> int | None:
        """Id of a named special token ("bos", "eos", "pad", ...), or None if it has none."""
        text = self.special_tokens.get(f"{name}_token")
        return None if text is None else self._backend.token_to_id(text)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; add_special_tokens adds BOS/EOS as the model's config says."""
        return list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids` (ids outside the vocabulary are dropped)."""
        return str(self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_to_str(self, token_id: int) -> str:
        """Text of one token as a client sees it in logprobs (special tokens included)."""
        return self.decode([token_id], skip_special_tokens=False)

    def render_chat(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        """The prompt text the chat template makes of `messages` (OpenAI-style dicts)."""
        template = self._compiled_template()
        chat = _check_messages(messages)
        try:
            return template.render(
                messages=chat,
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template rejected the messages: {exc}") from None

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of the rendered chat (the template carries its own special tokens)."""
        return self.encode(
            self.render_chat(messages, add_generation_prompt), add_special_tokens=False
        )

    def _compiled_template(self) -> jinja2.Template:
        if self._template is None:
            if self.chat_template is None:
                raise ValueError(
                    "this model has no chat template (chat_template.jinja or "
                    "tokenizer_config.json chat_template); use a completion"
                )
            try:
                self._template = _environment().from_string(self.chat_template)
            except jinja2.TemplateError as exc:
                raise ValueError(f"chat template does not compile: {exc}") from None
        return self._template


class IncrementalDetokenizer:
    """Streams the text of generated tokens without ever cutting a UTF-8 character.

    Keeps two offsets into a short token window: text before `read_offset` has been
    emitted; decoding from `prefix_offset` gives the context that spacing rules need. Each
    `add` decodes only that window. Text ending in U+FFFD (an incomplete character) is held
    back until a later token completes it, or until `flush`.
    """

    _CONTEXT = 5  # prompt tokens kept as decoding context
    _TRIM = 64  # drop emitted tokens from the window beyond this many

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int] | None = None,
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._tokens: list[int] = list(prompt_ids[-self._CONTEXT :]) if prompt_ids else []
        self._prefix_offset = 0
        self._read_offset = len(self._tokens)

    def add(self, token_id: int) -> str:
        """Append one token; return the text it completes ('' while a character is partial)."""
        self._tokens.append(token_id)
        return self._emit(final=False)

    def flush(self) -> str:
        """Text still held back (an unfinished character decodes as U+FFFD)."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        if self._read_offset == len(self._tokens):
            return ""
        decode = self._tokenizer.decode
        prefix = decode(self._tokens[self._prefix_offset : self._read_offset], self._skip)
        text = decode(self._tokens[self._prefix_offset :], self._skip)
        if text.endswith("\ufffd") and not final:
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._tokens)
        if self._prefix_offset > self._TRIM:
            del self._tokens[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
        return text[len(prefix) :]


def _read_json(path: Path, required: bool = False) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise ValueError(f"tokenizer file {path} is missing")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return data


def _token_text(value: object) -> str | None:
    """A special token as tokenizer_config stores it: a string or {"content": ...}."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _eos_ids(backend: BackendTokenizer, eos_text: str | None, path: Path) -> frozenset[int]:
    """EOS ids from the tokenizer's eos_token, config.json and generation_config.json."""
    ids: set[int] = set()
    if eos_text is not None and (token_id := backend.token_to_id(eos_text)) is not None:
        ids.add(token_id)
    for name in ("config.json", "generation_config.json"):
        value = _read_json(path / name).get("eos_token_id")
        values = value if isinstance(value, list) else [value]
        ids.update(v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0)
    return frozenset(ids)


def _chat_template(path: Path, config: Mapping[str, Any]) -> str | None:
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
