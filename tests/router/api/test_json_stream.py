"""The streaming JSON reader: whatever way a value's text is split, its pieces join to what
`json.loads` then `tool_parsers.dumps` make of the whole text, and it refuses exactly the
texts `json.loads` refuses."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.api.json_stream import JsonReader, JsonSyntaxError, Piece
from router.api.tool_parsers import dumps

TRICKY = st.sampled_from(['"', "\\", "/", "\n", "\x01", "é", "😀", "\ud83d", "<tool_call>", " "])
TEXT = st.lists(st.text(max_size=4) | TRICKY, max_size=3).map("".join)
SCALARS = (
    st.none() | st.booleans() | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False) | TEXT
)  # fmt: skip
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
CONTAINERS = st.lists(VALUES, max_size=3) | st.dictionaries(TEXT, VALUES, max_size=3)


@st.composite
def written(draw: st.DrawFn, values: st.SearchStrategy[Any]) -> str:
    """A value as some writer might write it: spacing, indent and escapes vary."""
    value = draw(values)
    separators = draw(st.sampled_from([(",", ":"), (", ", ": "), (" , ", " :\t"), (",\n", ":")]))
    indent = draw(st.sampled_from([None, 0, 2, "\t"]))
    text = json.dumps(value, ensure_ascii=draw(st.booleans()), separators=separators, indent=indent)
    return draw(st.sampled_from(["", " ", "\n"])) + text + draw(st.sampled_from(["", " \r\n"]))


@st.composite
def split(draw: st.DrawFn, text: str) -> list[str]:
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@st.composite
def near_miss_of(draw: st.DrawFn, text: str, noise: list[str]) -> str:
    """`text` cut short, or with a character dropped or one of `noise` added."""
    at = draw(st.integers(0, len(text)))
    change = draw(st.sampled_from(["cut", "drop", "add"]))
    if change == "cut":
        return text[:at]
    if change == "drop":
        return text[:at] + text[at + 1 :]
    return text[:at] + draw(st.sampled_from(noise)) + text[at:]


def read(pieces: list[str]) -> list[Piece]:
    reader = JsonReader()
    out = [p for text in pieces for p in reader.feed(text)]
    reader.end()
    return out


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_pieces_join_to_the_value_written_normalized(data: st.DataObject) -> None:
    text = data.draw(written(CONTAINERS))
    pieces = read(data.draw(split(text)))
    assert "".join(p.text for p in pieces) == dumps(json.loads(text))


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_it_refuses_what_json_loads_refuses(data: st.DataObject) -> None:
    """Near-misses of valid JSON: a character dropped, added or swapped, or the text cut."""
    text = data.draw(near_miss_of(data.draw(written(CONTAINERS)), list('{}[]",:\\ 0-.eEtnu1x')))
    try:
        expected: Any = json.loads(text)
    except json.JSONDecodeError:
        expected = None
    try:
        got = "".join(p.text for p in read(data.draw(split(text))))
    except JsonSyntaxError:
        got = None
    if isinstance(expected, dict | list):
        assert got == dumps(expected)
    else:  # refused, or a value that is no object or array
        assert got is None


def test_paths_tell_which_value_a_piece_belongs_to() -> None:
    pieces = read(['{"a": [1, {"b": "xy"}], "c"', ": null}"])
    assert [(p.path, p.text) for p in pieces] == [
        ((), "{"), ((), '"a"'), ((), ": "), (("a",), "["), (("a", 0), "1"), (("a",), ", "),
        (("a", 1), "{"), (("a", 1), '"b"'), (("a", 1), ": "), (("a", 1, "b"), '"'),
        (("a", 1, "b"), "xy"), (("a", 1, "b"), '"'), (("a", 1), "}"), (("a",), "]"),
        ((), ", "), ((), '"c"'), ((), ": "), (("c",), "null"), ((), "}"),
    ]  # fmt: skip


def test_string_characters_come_out_as_they_arrive() -> None:
    reader = JsonReader()
    assert [p.text for p in reader.feed('{"q": "ab')] == ["{", '"q"', ": ", '"', "ab"]
    assert [p.text for p in reader.feed("c\\")] == ["c"]  # the escape waits for its letter
    assert [p.text for p in reader.feed("n\\ud83d")] == ["\\n"]  # a high surrogate waits
    assert [p.chars for p in reader.feed('\\ude00"}')] == ["😀", "", ""]


@pytest.mark.parametrize(
    ("roots", "text"),
    [("{", "[1]"), ("{[", '"text"'), ("{[", "1"), ("{", "{} x"), ("{", '{"a": 01}'),
     ("{", '{"a": "\\x"}'), ("{", '{"a": "\t"}'), ("{", '{"a": 1,}'), ("{", "{'a': 1}")],
)  # fmt: skip
def test_what_is_no_such_value_is_refused(roots: str, text: str) -> None:
    reader = JsonReader(roots)
    with pytest.raises(JsonSyntaxError):
        reader.feed(text)
        reader.end()
