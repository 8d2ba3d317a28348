"""Reading harmony output (router.api.harmony): channels into thinking, answer and tool call
markup, the same whole and cut into pieces anywhere (inside special tokens too); the call
markup read by the `openai` parser, whole and streamed."""

from __future__ import annotations

import json

import pytest

from router.api.harmony import HarmonySplitter
from router.api.reasoning import Split
from router.api.tool_parsers import PARSERS, ParsedCall, parser_for
from router.api.tool_stream import FORMATS, CallArgs, CallStart, Content, ToolStream

THINK = "<|channel|>analysis<|message|>User asks about weather. Need tool.<|end|>"
CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"location": "Tokyo"}<|call|>'
)
FINAL = "<|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>"
NAMES = frozenset({"get_weather", "get_time"})


def split(text: str, size: int, reasoning: bool = True, calls: bool = True) -> Split:
    """The text fed in pieces of `size` characters, joined."""
    splitter = HarmonySplitter(reasoning, calls)
    parts = [splitter.feed(text[i : i + size]) for i in range(0, len(text), size)]
    parts.append(splitter.flush())
    return Split("".join(p.reasoning for p in parts), "".join(p.content for p in parts))


SIZES = [1, 2, 3, 5, 7, 11, 1000]


@pytest.mark.parametrize("size", SIZES)
def test_thinking_and_answer(size: int) -> None:
    got = split(THINK + FINAL, size)
    assert got == Split("User asks about weather. Need tool.", "It is sunny.")


@pytest.mark.parametrize("size", SIZES)
def test_a_call_after_thinking_is_markup_the_openai_parser_reads(size: int) -> None:
    got = split(THINK + CALL, size)
    assert got.reasoning == "User asks about weather. Need tool."
    parsed = PARSERS["openai"].parse(got.content, NAMES)
    assert parsed is not None
    assert parsed.content is None
    assert parsed.calls == [ParsedCall("get_weather", '{"location": "Tokyo"}')]


def test_recipient_in_the_role_a_preamble_and_no_arguments() -> None:
    text = (
        "<|channel|>commentary<|message|>Checking the time.<|end|>"
        "<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|><|call|>"
    )
    parsed = PARSERS["openai"].parse(split(text, 4).content, NAMES)
    assert parsed is not None
    assert parsed.content == "Checking the time."
    assert parsed.calls == [ParsedCall("get_time", "{}")]


def test_without_the_reasoning_parser_the_thinking_stays_in_the_answer() -> None:
    got = split(THINK + FINAL, 3, reasoning=False)
    assert got == Split("", "User asks about weather. Need tool.\nIt is sunny.")


def test_a_call_is_dropped_when_no_tools_are_offered() -> None:
    assert split(THINK + CALL, 3, calls=False) == Split("User asks about weather. Need tool.", "")


def test_output_that_is_not_harmony_is_all_answer() -> None:
    assert split("Hello <|end|> there", 2) == Split("", "Hello <|end|> there")


def test_an_output_cut_short_ends_its_message() -> None:
    assert split("<|channel|>analysis<|message|>Still think", 4) == Split("Still think", "")
    assert split("<|channel|>analysis<|message|>Done<|end|><|start|>assistant<|chan", 4) == Split(
        "Done", ""
    )


def test_a_body_ends_at_a_start_without_its_end() -> None:
    text = "<|channel|>analysis<|message|>A<|start|>assistant<|channel|>final<|message|>B"
    assert split(text, 5) == Split("A", "B")


def test_auto_reads_a_harmony_models_calls_as_openai() -> None:
    assert parser_for("auto", None, harmony=True).name == "openai"
    assert parser_for("hermes", "<tool_call>", harmony=True).name == "openai"


@pytest.mark.parametrize("size", SIZES)
def test_the_call_streams_name_first_then_arguments(size: int) -> None:
    """The splitter's answer, streamed through the `openai` call format, gives the call's
    name once and its arguments joined, the same for every cut."""
    splitter = HarmonySplitter(True, True)
    stream = ToolStream(FORMATS["openai"], NAMES)
    text = THINK + "<|start|>assistant<|channel|>commentary<|message|>On it.<|end|>" + CALL
    events = []
    for i in range(0, len(text), size):
        events += stream.feed(splitter.feed(text[i : i + size]).content)
    events += stream.feed(splitter.flush().content) + stream.finish()
    content = "".join(e.text for e in events if isinstance(e, Content))
    starts = [e for e in events if isinstance(e, CallStart)]
    args = "".join(e.text for e in events if isinstance(e, CallArgs))
    assert content == "On it."
    assert starts == [CallStart(0, "get_weather")]
    assert json.loads(args) == {"location": "Tokyo"}
    assert stream.complete
