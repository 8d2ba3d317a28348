"""Tokenizer of a HF model directory, without torch or transformers.

The router tokenizes and detokenizes with this package, so it imports only `tokenizers`
and jinja2. It reproduces what transformers (5.x) AutoTokenizer does for tokenizer.json
models: encode / decode through the same Rust backend, and chat templates
(models.chat_template) rendered, then encoded without extra special tokens.

BOS/EOS insertion: like transformers 5, tokenizer.json's post-processor alone decides;
`add_bos_token` / `add_eos_token` in tokenizer_config.json are ignored when tokenizer.json
exists (transformers 4's Llama tokenizers honoured them). `clean_up_tokenization_spaces` is
not applied (transformers 5 defaults it off; it corrupts BPE text).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as BackendTokenizer

from models.chat_template import ChatTemplate, load_chat_template

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
        self._template = ChatTemplate(chat_template) if chat_template is not None else None

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
        return cls(backend, special, eos_ids, load_chat_template(path, config))

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer knows, added tokens included."""
        return int(self._backend.get_vocab_size(with_added_tokens=True))

    def token_id(self, name: str) -> int | None:
        """Id of a named special token ("bos", "eos", "pad", ...), or None if it has none."""
        text = self.special_tokens.get(f"{name}_token")
        return None if text is None else self._backend.token_to_id(text)

    def token_id_of(self, text: str) -> int | None:
        """Id of the token whose text is `text` (an added token's too), or None."""
        token_id = self._backend.token_to_id(text)
        return None if token_id is None else int(token_id)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; add_special_tokens adds BOS/EOS as the model's config says."""
        return list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids` (ids outside the vocabulary are dropped)."""
        return str(self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_to_str(self, token_id: int) -> str:
        """Text of one token as a client sees it in logprobs (special tokens included)."""
        return self.decode([token_id], skip_special_tokens=False)

    @property
    def chat_template_uses_tools(self) -> bool:
        """True when the chat template renders tool definitions itself (`tools`)."""
        return self._template is not None and self._template.uses_tools

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text the chat template makes of `messages` (OpenAI-style dicts);
        `variables`: more template variables (a request's chat_template_kwargs)."""
        if self._template is None:
            raise ValueError(
                "this model has no chat template (chat_template.jinja or "
                "tokenizer_config.json chat_template); use a completion"
            )
        return self._template.render(
            messages, add_generation_prompt, self.special_tokens, tools=tools, variables=variables
        )

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of the rendered chat (the template carries its own special tokens)."""
        text = self.render_chat(messages, add_generation_prompt, tools, variables)
        return self.encode(text, add_special_tokens=False)


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
