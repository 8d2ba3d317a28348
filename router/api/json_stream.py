"""Reading one JSON value as its text arrives, and writing it out normalized as it goes.

`JsonReader` is a push parser: `feed` takes text in pieces of any size and returns `Piece`s,
each a bit of the value written as `tool_parsers.dumps` writes the whole value (separators
", " and ": ", no other whitespace, strings with ensure_ascii off, numbers as Python prints
what `json.loads` read), tagged with the path of the value it belongs to. Joining the pieces
of a value gives `dumps(json.loads(its text))`, whatever way its text was split. String
characters come out as they arrive; a number or a literal once what follows it ends it.
Syntax is Python's `json.loads` (NaN and Infinity allowed, control characters in strings
not), so that a value this reader accepts is one that `json.loads` accepts, and the reverse.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

JSON_SPACE = " \t\n\r"
_SCALAR = re.compile(
    r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|true|false|null|NaN|-?Infinity"
)
_SCALAR_CHARS = frozenset(string.ascii_letters + string.digits + "+-.")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX = frozenset(string.hexdigits)

Path = tuple[str | int, ...]
Kind = Literal["open", "close", "key", "colon", "comma", "scalar", "str_open", "str", "str_close"]


class JsonSyntaxError(ValueError):
    """The text is no JSON value (or not the kind of value the reader takes)."""


class Piece(NamedTuple):
    """A bit of normalized output. `path`: the value it belongs to (keys, colons and commas:
    their container's). `chars`: a key's or a string bit's characters, decoded."""

    kind: Kind
    path: Path
    text: str
    chars: str = ""


def is_json_space(ch: str) -> bool:
    return ch in JSON_SPACE


@dataclass
class _Frame:
    bracket: str  # "{" or "["
    path: Path
    key: str = ""  # objects: the key whose value comes next
    count: int = 0  # arrays: the index of the value that comes next


@dataclass
class _Text:
    """A string being read: a key, or a value at `path`."""

    path: Path
    is_key: bool
    chars: list[str]
    escape: str | None = None  # after a backslash: what followed it so far
    high: str = ""  # a high surrogate waiting for its low half


class JsonReader:
    """One JSON object or array (`roots` names which), fed as text arrives.

    `space` says what may stand before and after the value (json.loads: JSON whitespace;
    a text that is stripped first: any whitespace). Inside it, only JSON whitespace.
    """

    def __init__(self, roots: str = "{[", space: Callable[[str], bool] = is_json_space) -> None:
        self._roots = roots
        self._space = space
        self._stack: list[_Frame] = []
        self._expect = "lead"
        self._text: _Text | None = None
        self._scalar: tuple[Path, str] | None = None
        self._out: list[Piece] = []

    @property
    def done(self) -> bool:
        """The value is complete (only `space` may follow)."""
        return self._expect == "trail"

    @property
    def started(self) -> bool:
        return self._expect != "lead"

    def feed(self, text: str) -> list[Piece]:
        """The pieces `text` completes; JsonSyntaxError at the first character that cannot
        continue a value."""
        for ch in text:
            if self._text is not None:
                self._text_char(self._text, ch)
            elif self._scalar is not None and ch in _SCALAR_CHARS:
                self._scalar = (self._scalar[0], self._scalar[1] + ch)
            else:
                if self._scalar is not None:
                    self._end_scalar(*self._scalar)
                self._char(ch)
        if self._text is not None:
            self._flush_chars(self._text)
        out, self._out = self._out, []
        return out

    def end(self) -> None:
        """The text is over: JsonSyntaxError unless the value is complete."""
        if not self.done:
            raise JsonSyntaxError("the JSON value is incomplete")

    # ------------------------------------------------------------ structure

    def _char(self, ch: str) -> None:
        expect = self._expect
        if expect in ("lead", "trail"):
            if self._space(ch):
                return
            if expect == "lead" and ch in self._roots:
                self._open(ch, ())
                return
            raise JsonSyntaxError(f"unexpected {ch!r} outside the JSON value")
        if ch in JSON_SPACE:
            return
        frame = self._stack[-1]
        if expect == "colon" and ch == ":":
            self._emit("colon", frame.path, ": ")
            self._expect = "value"
        elif expect == "comma_or_close" and ch == ",":
            self._emit("comma", frame.path, ", ")
            frame.count += 1
            self._expect = "key" if frame.bracket == "{" else "value"
        elif ch in "}]" and (expect == "comma_or_close" or expect == "close_" + ch):
            self._close(ch)
        elif expect in ("key", "close_}") and ch == '"':
            self._text = _Text(frame.path, True, [])
        elif expect in ("value", "close_]"):
            self._value(ch, self._value_path(frame))
        else:
            raise JsonSyntaxError(f"unexpected {ch!r} in JSON")

    def _value(self, ch: str, path: Path) -> None:
        if ch in "{[":
            self._open(ch, path)
        elif ch == '"':
            self._emit("str_open", path, '"')
            self._text = _Text(path, False, [])
        elif ch in _SCALAR_CHARS:
            self._scalar = (path, ch)
        else:
            raise JsonSyntaxError(f"unexpected {ch!r} where a JSON value starts")

    def _open(self, bracket: str, path: Path) -> None:
        self._emit("open", path, bracket)
        self._stack.append(_Frame(bracket, path))
        self._expect = "close_" + ("}" if bracket == "{" else "]")

    def _close(self, bracket: str) -> None:
        frame = self._stack.pop()
        if (frame.bracket == "{") != (bracket == "}"):
            raise JsonSyntaxError(f"unexpected {bracket!r} in JSON")
        self._emit("close", frame.path, bracket)
        self._after_value()

    def _after_value(self) -> None:
        self._expect = "comma_or_close" if self._stack else "trail"

    def _value_path(self, frame: _Frame) -> Path:
        return (*frame.path, frame.key if frame.bracket == "{" else frame.count)

    def _end_scalar(self, path: Path, raw: str) -> None:
        self._scalar = None
        if not _SCALAR.fullmatch(raw):
            raise JsonSyntaxError(f"{raw!r} is no JSON value")
        self._emit("scalar", path, _dumps(json.loads(raw)))
        self._after_value()

    def _emit(self, kind: Kind, path: Path, text: str, chars: str = "") -> None:
        self._out.append(Piece(kind, path, text, chars))

    # ------------------------------------------------------------ strings

    def _text_char(self, text: _Text, ch: str) -> None:
        if text.escape is not None:
            self._escape_char(text, ch)
        elif ch == '"':
            self._end_text(text)
        elif ch == "\\":
            text.escape = ""
        elif ch < " ":
            raise JsonSyntaxError(f"control character {ch!r} in a JSON string")
        else:
            self._add(text, ch)

    def _escape_char(self, text: _Text, ch: str) -> None:
        escape = (text.escape or "") + ch
        if escape[0] != "u":
            if ch not in _ESCAPES:
                raise JsonSyntaxError(f"invalid escape \\{ch} in a JSON string")
            text.escape = None
            self._add(text, _ESCAPES[ch])
            return
        if len(escape) > 1 and ch not in _HEX:
            raise JsonSyntaxError(f"invalid escape \\{escape} in a JSON string")
        text.escape = escape
        if len(escape) == 5:
            text.escape = None
            self._add_code(text, int(escape[1:], 16))

    def _add_code(self, text: _Text, code: int) -> None:
        """A \\uXXXX escape: a high surrogate waits for a low one to join (as json does)."""
        if 0xDC00 <= code <= 0xDFFF and text.high:
            high, text.high = ord(text.high), ""
            text.chars.append(chr(0x10000 + ((high - 0xD800) << 10) + (code - 0xDC00)))
        elif 0xD800 <= code <= 0xDBFF:
            self._add(text, "")
            text.high = chr(code)
        else:
            self._add(text, chr(code))

    def _add(self, text: _Text, chars: str) -> None:
        if text.high:
            text.chars.append(text.high)
            text.high = ""
        text.chars.append(chars)

    def _end_text(self, text: _Text) -> None:
        self._add(text, "")
        self._text = None
        if text.is_key:
            key = "".join(text.chars)
            self._stack[-1].key = key
            self._emit("key", text.path, _dumps(key), key)
            self._expect = "colon"
            return
        self._flush_chars(text)
        self._emit("str_close", text.path, '"')
        self._after_value()

    def _flush_chars(self, text: _Text) -> None:
        if text.is_key or not text.chars:
            return
        chars = "".join(text.chars)
        text.chars.clear()
        if chars:
            self._emit("str", text.path, _dumps(chars)[1:-1], chars)


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)
