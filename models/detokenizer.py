"""Incremental detokenization of generated tokens."""

from __future__ import annotations

from collections.abc import Sequence

from models.tokenizer import Tokenizer


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
