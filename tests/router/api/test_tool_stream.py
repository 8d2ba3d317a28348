"""Tool calls read while the answer streams, against the whole-text parsers: for an answer in
each format (hermes, json, mistral, openai, a forced call's bare object), split into pieces any way,
the stream gives the calls and content the whole text gives; markup of a call never shows
as content; once a call has started, text that stops being calls marks the stream broken."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_json_stream import TEXT, VALUES, near_miss_of, split

from router.api.requests import ToolDefinition
from router.api.tool_call_reader import CallArgs, CallStart
from router.api.tool_parsers import (
    CLOSE,
    MISTRAL_MARK,
    OPEN,
    OPENAI_CLOSE,
    OPENAI_OPEN,
    PARSERS,
    ParsedOutput,
    dumps,
)
from router.api.tool_stream import Content, Event, ToolStream, stream_for
from router.api.tools import ToolPlan, parse_tool_calls

NAMES = ("get_weather", "get_time", "search")
FORMATS = (*sorted(PARSERS), "forced")
ARGS = st.dictionaries(TEXT, VALUES, max_size=3)
SPACE = st.sampled_from(["", " ", "\n", "\n\n", "\u00a0"])
CONTENT = st.lists(TEXT | st.sampled_from(["<tool", "[TOOL", "{", "[", "<"]), max_size=3).map(
    "".join
)


def plan(fmt: str) -> ToolPlan:
    tools = tuple(
        ToolDefinition.model_validate({"type": "function", "function": {"name": n}}) for n in NAMES
    )
    return ToolPlan("auto" if fmt != "forced" else "required", tools, None)


def whole(fmt: str, text: str) -> ParsedOutput | None:
    return parse_tool_calls(text, plan(fmt), PARSERS.get(fmt, PARSERS["json"]))


def streamed(fmt: str, pieces: list[str]) -> tuple[ToolStream, list[Event]]:
    stream = stream_for(plan(fmt), PARSERS.get(fmt, PARSERS["json"]))
    events = [e for piece in pieces for e in stream.feed(piece)]
    return stream, events + stream.finish()


def calls_of(events: list[Event]) -> list[tuple[str, str]]:
    """(name, arguments) of each call, checking that each starts before its arguments, in
    index order."""
    calls: list[list[str]] = []
    for event in events:
        if isinstance(event, CallStart):
            assert event.index == len(calls)
            calls.append([event.name, ""])
        elif isinstance(event, CallArgs):
            assert event.index < len(calls)
            calls[event.index][1] += event.text
    return [(name, arguments) for name, arguments in calls]


def repeats_a_key(text: str) -> bool:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        repeated.extend(k for k, _ in items if sum(k == j for j, _ in items) > 1)
        return dict(items)

    repeated: list[str] = []
    json.loads(text, object_pairs_hook=pairs)
    return bool(repeated)


@st.composite
def call_text(draw: st.DrawFn) -> str:
    """One call object, written as models write them: key order, spacing, escapes vary;
    arguments as an object or a string, or as "parameters", or left out when empty."""
    name, arguments = draw(st.sampled_from(NAMES)), draw(ARGS)
    style = draw(st.sampled_from(["object", "string", "parameters", "omitted"]))
    if style == "omitted" and arguments:
        style = "object"
    fields: list[tuple[str, Any]] = [("name", name)]
    if style != "omitted":
        key = "parameters" if style == "parameters" else "arguments"
        fields.append((key, json.dumps(arguments) if style == "string" else arguments))
    if draw(st.booleans()):
        fields.append(("id", draw(TEXT)))
    fields = draw(st.permutations(fields))
    separators = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,", " : ")]))
    ascii_only = draw(st.booleans())
    return json.dumps(dict(fields), ensure_ascii=ascii_only, separators=separators)


@st.composite
def answer(draw: st.DrawFn, fmt: str) -> str:
    """An answer that calls functions in `fmt`, with the content and spacing models add."""
    calls = draw(st.lists(call_text(), min_size=1, max_size=3))
    if fmt == "forced" or (fmt == "json" and draw(st.booleans())):
        return draw(SPACE) + calls[0] + draw(SPACE)
    content = draw(CONTENT) + draw(SPACE)
    if fmt == "mistral":
        body = "[" + ", ".join(calls) + "]" if len(calls) > 1 or draw(st.booleans()) else calls[0]
        if not content.strip() and draw(st.booleans()):
            return body  # the marker skipped by detokenization
        return content + MISTRAL_MARK + draw(st.sampled_from(["", " "])) + body
    opener, closer = (OPENAI_OPEN, OPENAI_CLOSE) if fmt == "openai" else (OPEN, CLOSE)
    tags = [opener + draw(SPACE) + c + draw(SPACE) + closer + draw(SPACE | TEXT) for c in calls]
    if draw(st.booleans()):  # the last tag left open
        tags[-1] = tags[-1][: tags[-1].rindex(closer)]
    return content + "".join(tags)


@st.composite
def near_miss(draw: st.DrawFn, fmt: str) -> str:
    """An answer cut short, or with a character dropped or added: calls or not."""
    noise = [*'{}[]",:\\ <>/x', OPEN, CLOSE, MISTRAL_MARK, OPENAI_OPEN, OPENAI_CLOSE]
    return draw(near_miss_of(draw(answer(fmt)), noise))


def check(fmt: str, text: str, pieces: list[str]) -> None:
    expected = whole(fmt, text)
    stream, events = streamed(fmt, pieces)
    content = "".join(e.text for e in events if isinstance(e, Content))
    if expected is not None:
        assert stream.complete
        calls = calls_of(events)
        assert [(n, dumps(json.loads(a))) for n, a in calls] == [
            (c.name, c.arguments) for c in expected.calls
        ]
        # to the letter, but where a key repeats: the stream writes each, json.loads the last
        if not any(repeats_a_key(a) for _, a in calls):
            assert [a for _, a in calls] == [c.arguments for c in expected.calls]
        assert content.lstrip() == (expected.content or "")  # leading whitespace goes out
    elif not stream.calls:
        assert content == text  # no call: all of it, as it was
    else:
        assert stream.broken  # a call started, then the text stopped being calls


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_any_split_of_an_answer_gives_the_whole_texts_calls(fmt: str, data: st.DataObject) -> None:
    text = data.draw(answer(fmt))
    assume(whole(fmt, text) is not None)  # a marker the content or a string drew can spoil it
    check(fmt, text, data.draw(split(text)))


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_near_misses_agree_with_the_whole_text(fmt: str, data: st.DataObject) -> None:
    text = data.draw(near_miss(fmt) | CONTENT)
    check(fmt, text, data.draw(split(text)))


def test_a_call_starts_at_its_name_and_its_arguments_follow_as_they_come() -> None:
    stream = stream_for(plan("hermes"), PARSERS["hermes"])
    assert stream.feed("Let me look. <tool") == [Content("Let me look.")]
    assert stream.feed('_call>\n{"name": "get_ti') == []
    assert stream.feed('me", "arguments": {"zone": "U') == [
        CallStart(0, "get_time"),
        CallArgs(0, '{"zone": "U'),
    ]
    assert stream.feed('TC"}}\n</tool_call>') == [CallArgs(0, 'TC"}')]
    assert stream.finish() == [] and stream.complete


def test_arguments_before_the_name_wait_for_it() -> None:
    stream = stream_for(plan("forced"), PARSERS["json"])
    assert stream.feed('{"arguments": {"q": 1},') == []
    assert stream.feed('"name": "search"}') == [CallStart(0, "search"), CallArgs(0, '{"q": 1}')]


@pytest.mark.parametrize(
    ("fmt", "text"),
    [("hermes", 'Hi <tool_call>{"name": "launch", "arguments": {}}</tool_call>'),
     ("json", '{"answer": 42} and more'),
     ("mistral", "[1] is a citation"),
     ("forced", '{"name": "get_ti'),
     ("hermes", "a < b and <tool_call> is a tag")],
)  # fmt: skip
def test_what_turns_out_no_call_goes_out_whole_as_content(fmt: str, text: str) -> None:
    stream, events = streamed(fmt, list(text))
    assert whole(fmt, text) is None and not stream.calls
    assert "".join(e.text for e in events if isinstance(e, Content)) == text


@pytest.mark.parametrize(
    ("fmt", "text", "sent"),
    [("hermes", '<tool_call>{"name": "get_time", "arguments": {"a": 1}}</tool_call>'
      '<tool_call>{"name": "launch"}</tool_call>', '{"a": 1}'),
     ("forced", '{"name": "search", "arguments": {"q": "x"}} trailing', '{"q": "x"}'),
     ("mistral", '[{"name": "search", "arguments": {"q": ', '{"q": ')],
)  # fmt: skip
def test_a_started_call_that_stops_being_one_is_broken(fmt: str, text: str, sent: str) -> None:
    stream, events = streamed(fmt, list(text))
    assert whole(fmt, text) is None and stream.broken and not stream.complete
    assert calls_of(events)[0][1] == sent
    assert not any(isinstance(e, Content) for e in events)
