"""Reading tool calls out of JSON as its text arrives: a call's name as soon as it is read,
then its arguments as they come, written as `tool_parsers` writes them once whole.

A call is an object `{"name": ..., "arguments": {...}}` (or "parameters", read only when
"arguments" is absent; arguments may also be a string that holds the JSON object), the
value `tool_parsers` reads with `json.loads`. The events joined give what it gives for the
same text; NotACall is raised as soon as the text can no longer be calls, where it gives
None. A repeated "name" or "arguments" counts the first time (json.loads keeps the last);
a key repeated inside the arguments is written each time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from router.api.json_stream import JsonReader, JsonSyntaxError, Piece


class NotACall(ValueError):
    """The text is no call (or no longer one): bad JSON, an unknown function, arguments that
    are no object."""


@dataclass(frozen=True)
class CallStart:
    """Call `index` has begun: its function's name is known."""

    index: int
    name: str


@dataclass(frozen=True)
class CallArgs:
    """More of call `index`'s arguments (JSON text; the pieces join to the whole)."""

    index: int
    text: str


class CallsReader:
    """The calls in one JSON value: a call object, or (`roots` with "[") an array of them.

    `first_index` numbers its first call; `next_index` is one past the last started.
    """

    def __init__(
        self, names: frozenset[str], first_index: int, roots: str, space: Callable[[str], bool]
    ) -> None:
        self._json = JsonReader(roots, space)
        self._names = names
        self._depth = 0  # where calls sit: 0 at the root, 1 in a root array
        self._calls: list[_Call] = []
        self._first = first_index

    @property
    def next_index(self) -> int:
        return self._first + sum(c.name is not None for c in self._calls)

    def feed(self, text: str, out: list[CallStart | CallArgs]) -> None:
        """Events for `text` go to `out` (those before a NotACall too)."""
        try:
            pieces = self._json.feed(text)
        except JsonSyntaxError as err:
            raise NotACall(str(err)) from None
        for piece in pieces:
            self._take(piece, out)

    def end(self) -> None:
        """The text is over: NotACall unless the value is complete."""
        try:
            self._json.end()
        except JsonSyntaxError as err:
            raise NotACall(str(err)) from None

    def _take(self, piece: Piece, out: list[CallStart | CallArgs]) -> None:
        if not piece.path and piece.kind == "open":
            self._depth = 1 if piece.text == "[" else 0
            if self._depth == 0:
                self._calls.append(_Call(self._first, self._names))
            return
        if len(piece.path) < self._depth:  # the root array's comma or end
            if piece.kind == "close" and not self._calls:
                raise NotACall("no calls in the array")
            return
        if len(piece.path) == self._depth:  # the call object itself
            self._own(piece, out)
            return
        self._calls[-1].take(piece, piece.path[self._depth], self._depth, out)

    def _own(self, piece: Piece, out: list[CallStart | CallArgs]) -> None:
        if piece.kind == "open" and piece.text == "{":
            self._calls.append(_Call(self._first + len(self._calls), self._names))
        elif piece.kind == "close":
            self._calls[-1].close(out)
        elif piece.kind not in ("key", "colon", "comma"):
            raise NotACall("a call is no JSON object")


class _Call:
    def __init__(self, index: int, names: frozenset[str]) -> None:
        self.index = index
        self.name: str | None = None
        self._names = names
        self._name_chars: list[str] = []
        self._args = _Args()
        self._params = _Args()
        self._params_text: list[str] | None = []  # None: not an object
        self._early: list[str] = []  # arguments that came before the name

    def take(
        self, piece: Piece, key: str | int, depth: int, out: list[CallStart | CallArgs]
    ) -> None:
        own = len(piece.path) == depth + 1
        if key == "name" and own:
            self._name(piece, out)
        elif key == "arguments":
            text = self._args.take(piece, own)
            if text and self.name is None:
                self._early.append(text)
            elif text:
                out.append(CallArgs(self.index, text))
        elif key == "parameters" and self._params_text is not None:
            try:
                self._params_text.append(self._params.take(piece, own))
            except NotACall:
                self._params_text = None

    def close(self, out: list[CallStart | CallArgs]) -> None:
        if self.name is None:
            raise NotACall("a call without a name")
        if self._args.seen:
            return
        if self._params.seen and self._params_text is None:
            raise NotACall("the call's parameters are no object")
        text = "".join(self._params_text or []) if self._params.seen else "{}"
        out.append(CallArgs(self.index, text))

    def _name(self, piece: Piece, out: list[CallStart | CallArgs]) -> None:
        if self.name is not None:  # a repeated key
            return
        if piece.kind == "str":
            self._name_chars.append(piece.chars)
        elif piece.kind == "str_close":
            name = "".join(self._name_chars)
            if name not in self._names:
                raise NotACall(f"no function named {name!r}")
            self.name = name
            out.append(CallStart(self.index, name))
            if self._early:
                out.append(CallArgs(self.index, "".join(self._early)))
        elif piece.kind != "str_open":
            raise NotACall("a call's name is no string")


class _Args:
    """An arguments value: an object, or a string that holds one (written as the object)."""

    def __init__(self) -> None:
        self.seen = False
        self._done = False
        self._inner: JsonReader | None = None

    def take(self, piece: Piece, own: bool) -> str:
        """The text `piece` adds to the arguments (`own`: a piece of the value itself)."""
        if self._done:  # a repeated key
            return ""
        if not own:
            return piece.text
        if not self.seen:
            self.seen = True
            if piece.kind == "str_open":
                self._inner = JsonReader("{")
                return ""
            if piece.kind != "open" or piece.text != "{":
                raise NotACall("a call's arguments are no object")
        if self._inner is None:
            self._done = piece.kind == "close"
            return piece.text
        try:
            if piece.kind == "str":
                return "".join(p.text for p in self._inner.feed(piece.chars))
            self._inner.end()
        except JsonSyntaxError as err:
            raise NotACall(f"a call's arguments: {err}") from None
        self._done = True
        return ""
