"""Tool calls read while the answer streams: content as it comes, each call's name as soon
as it is read, then its arguments as they are generated.

`ToolStream` reads an answer in the format of a `tool_parsers` parser (or a forced call's
bare object) and gives what that parser gives for the whole text: its joined `Content` is
the content (the text before the first call, less the whitespace between it and the call),
its `CallStart` / `CallArgs` events the calls. Until a call's name is read nothing that may
belong to a call is given out: markup that turns out to be no call goes out as content,
whole, as the parser would leave it. Once a call has started the stream cannot take it
back: when the text then stops being calls (bad JSON, an unknown function, a later call
that does not parse), `broken` is set and the rest is dropped. Where it differs from the
whole-text parser: whitespace before the content, which the parser strips, goes out, and a
key repeated in an arguments object goes out each time (json.loads keeps the last).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from router.api.json_stream import is_json_space
from router.api.stop_strings import StopMatcher
from router.api.tool_call_reader import CallArgs, CallsReader, CallStart, NotACall
from router.api.tool_parsers import (
    CLOSE,
    MISTRAL_MARK,
    OPEN,
    OPENAI_CLOSE,
    OPENAI_OPEN,
    ToolParser,
)
from router.api.tools import ToolPlan


@dataclass(frozen=True)
class Content:
    text: str


Event = Content | CallStart | CallArgs
Mode = Literal["content", "body", "between", "plain", "broken"]


@dataclass(frozen=True)
class CallFormat:
    """Where calls stand in an answer.

    `opener` starts calls after content ("" for none), `closer` ends each call ("" when the
    calls run to the end); `body_roots` is what JSON follows the opener (an object: one call;
    an array: several), with `body_space` around it. `bare_roots`: a JSON value of these with
    only `bare_space` around it is calls as the whole answer too ("": never).
    """

    opener: str
    closer: str
    body_roots: str
    body_space: Callable[[str], bool]
    bare_roots: str
    bare_space: Callable[[str], bool]


FORMATS = {
    "hermes": CallFormat(OPEN, CLOSE, "{", str.isspace, "", str.isspace),
    "json": CallFormat(OPEN, CLOSE, "{", str.isspace, "{", str.isspace),
    "mistral": CallFormat(MISTRAL_MARK, "", "[{", is_json_space, "[{", is_json_space),
    "openai": CallFormat(OPENAI_OPEN, OPENAI_CLOSE, "{", str.isspace, "", str.isspace),
}
FORCED = CallFormat("", "", "", str.isspace, "{", str.isspace)  # the grammar's bare object


def stream_for(plan: ToolPlan, parser: ToolParser) -> ToolStream:
    """The stream reader that gives what `tools.parse_tool_calls` gives for `plan`."""
    return ToolStream(FORCED if plan.mode != "auto" else FORMATS[parser.name], plan.names)


class ToolStream:
    """Reads one answer as its text arrives (see the module's docstring)."""

    def __init__(self, fmt: CallFormat, names: frozenset[str]) -> None:
        self._fmt = fmt
        self._names = names
        self._mode: Mode = "content"
        self._opener = _Marker(fmt.opener)
        self._closer = _Marker("")  # in a body: its end, or what makes a bare one no call
        self._space = ""  # content: trailing whitespace, dropped if a call follows
        self._seen = False  # content: something not `bare_space` came
        self._bare = False  # the body is the whole answer
        self._bare_tried = False
        self._held: list[str] = []  # a body's text while no call has started
        self._reader: CallsReader | None = None
        self.calls = 0  # calls started
        self.broken = False

    @property
    def complete(self) -> bool:
        """Calls, and all of them whole."""
        return self.calls > 0 and not self.broken

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        while text:
            text = self._step(text, out)
        return _merged(out)

    def finish(self) -> list[Event]:
        """The text is over: what it still holds."""
        out: list[Event] = []
        while self._mode == "body":
            rest = self._end_body(out)
            while rest:
                rest = self._step(rest, out)
        if self._mode == "content":
            out.append(Content(self._space + self._opener.flush()))
            self._space = ""
        return _merged(out)

    def _step(self, text: str, out: list[Event]) -> str:
        """Reads what the mode takes of `text`; returns the rest, for the next mode."""
        if self._mode == "content":
            return self._content(text, out)
        if self._mode == "body":
            return self._body(text, out)
        if self._mode == "between":
            return self._between(text)
        if self._mode == "plain":
            out.append(Content(text))
        return ""

    def _content(self, text: str, out: list[Event]) -> str:
        fmt = self._fmt
        if not self._seen and fmt.bare_roots and not self._bare_tried:
            text, self._space = self._space + text, ""
            lead = next((i for i, ch in enumerate(text) if not fmt.bare_space(ch)), len(text))
            if lead == len(text):
                self._space = text
                return ""
            self._seen = True
            if text[lead] in fmt.bare_roots:
                self._start_body(bare=True, held="")
                return text
        if not fmt.opener:
            out.append(Content(self._space + text))
            self._space = ""
            return ""
        before, found, after = self._opener.feed(text)
        head = self._space + before
        shown = head.rstrip()
        out.append(Content(shown))
        self._space = head[len(shown) :]
        if not found:
            return ""
        self._start_body(bare=False, held=self._space + fmt.opener)
        self._space = ""
        return after

    def _between(self, text: str) -> str:
        """Text between calls, which the parsers skip."""
        _, found, after = self._opener.feed(text)
        if found:
            self._start_body(bare=False, held="")
        return after

    def _start_body(self, bare: bool, held: str) -> None:
        """`held`: what to give out as content if the body is no call."""
        fmt = self._fmt
        self._mode, self._bare, self._held = "body", bare, [held]
        if bare:
            self._reader = CallsReader(self._names, self.calls, fmt.bare_roots, fmt.bare_space)
        else:
            self._reader = CallsReader(self._names, self.calls, fmt.body_roots, fmt.body_space)
        self._closer = _Marker(fmt.opener if bare else fmt.closer)

    def _body(self, text: str, out: list[Event]) -> str:
        if not self.calls:
            self._held.append(text)
        part, found, after = self._closer.feed(text)
        calls: list[CallStart | CallArgs] = []
        try:
            if found and self._bare:
                raise NotACall("a bare call holds the format's opener")
            self._read(part, calls, end=found)
        except NotACall:
            return self._fail()
        finally:
            out.extend(calls)
        if found:
            self._mode = "between"
        return after

    def _end_body(self, out: list[Event]) -> str:
        calls: list[CallStart | CallArgs] = []
        try:
            self._read(self._closer.flush(), calls, end=True)
        except NotACall:
            return self._fail()
        finally:
            out.extend(calls)
        self._mode = "between"
        return ""

    def _read(self, text: str, calls: list[CallStart | CallArgs], end: bool) -> None:
        """Feeds the body's reader; `end`: the body ends there."""
        reader = self._reader
        assert reader is not None
        try:
            reader.feed(text, calls)
            if end:
                reader.end()
        finally:
            self.calls = reader.next_index
            if self.calls:
                self._held.clear()

    def _fail(self) -> str:
        """The body is no call: after a call started, the answer is broken; before, its
        text is content (a bare body's read again as such)."""
        self._reader = None
        if self.calls:
            self._mode, self.broken = "broken", True
            return ""
        held, self._held = "".join(self._held), []
        self._mode = "content" if self._bare else "plain"
        self._bare_tried = True
        return held


class _Marker:
    """Finds `marker` in text that arrives in pieces."""

    def __init__(self, marker: str) -> None:
        self._matcher = StopMatcher([marker] if marker else [])
        self._marker = marker

    def feed(self, text: str) -> tuple[str, bool, str]:
        """(text before the marker, or safe to pass on; whether it was found; what
        followed it)."""
        matcher = self._matcher
        before, found = matcher.feed(text)
        if found:
            self._matcher = StopMatcher([self._marker])
        return before, found, matcher.after

    def flush(self) -> str:
        return self._matcher.flush()


def _merged(events: list[Event]) -> list[Event]:
    """Adjacent content joined, as are adjacent arguments of one call; no empty content."""
    out: list[Event] = []
    for event in events:
        joined = _joined(out[-1], event) if out else None
        if joined is not None:
            out[-1] = joined
        else:
            out.append(event)
    return [e for e in out if not (isinstance(e, Content) and not e.text)]


def _joined(last: Event, event: Event) -> Event | None:
    if isinstance(last, Content) and isinstance(event, Content):
        return Content(last.text + event.text)
    if isinstance(last, CallArgs) and isinstance(event, CallArgs) and last.index == event.index:
        return CallArgs(event.index, last.text + event.text)
    return None
