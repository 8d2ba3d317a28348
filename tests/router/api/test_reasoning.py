"""The reasoning splitter: thinking apart from the answer, the same whatever the text's
pieces (streamed at every cut) as whole, for each parser and prompt ending."""

from __future__ import annotations

import pytest

from router.api.reasoning import ReasoningSplitter, Split, splitter_for

QWEN3_OUT = "<think>\nParis is in France.\n</think>\n\nThe capital is Paris."
R1_OUT = "Paris is in France.\n</think>\n\nThe capital is Paris."
THOUGHT, ANSWER = "Paris is in France.", "The capital is Paris."


def run(splitter: ReasoningSplitter, pieces: list[str]) -> Split:
    parts = [splitter.feed(p) for p in pieces] + [splitter.flush()]
    return Split("".join(p.reasoning for p in parts), "".join(p.content for p in parts))


def every_cut(text: str, thinking: bool) -> set[Split]:
    """The split of `text` fed whole, char by char, and in two pieces at every cut."""
    ways = [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]
    return {run(ReasoningSplitter(thinking), w) for w in ways}


@pytest.mark.parametrize(
    ("text", "thinking", "want"),
    [
        (QWEN3_OUT, False, Split(THOUGHT, ANSWER)),  # qwen3: the model opens its thinking
        (QWEN3_OUT, True, Split(THOUGHT, ANSWER)),  # an opening tag repeated is dropped
        (R1_OUT, True, Split(THOUGHT, ANSWER)),  # the prompt opened it
        ("The capital is Paris.", False, Split("", ANSWER)),  # no thinking at all
        ("Paris is in France.", True, Split(THOUGHT, "")),  # thinking never closed
        ("<thinking> is no tag", False, Split("", "<thinking> is no tag")),
        ("  <think>a < b</thin</think>x </think> y", False, Split("a < b</thin", "x </think> y")),
        ("<think></think>\n\nParis.", False, Split("", "Paris.")),
        ("", True, Split("", "")),
    ],
)
def test_the_split_is_the_same_at_every_cut(text: str, thinking: bool, want: Split) -> None:
    assert every_cut(text, thinking) == {want}


def test_thinking_streams_before_its_end_tag() -> None:
    splitter = ReasoningSplitter(thinking=False)
    assert splitter.feed("<think>\nParis is") == Split("Paris is", "")
    assert splitter.feed(" in France.\n</th") == Split(" in France.", "")  # held: a tag may come
    assert splitter.feed("ink>\n\nThe") == Split("", "The")
    assert splitter.feed(" capital") == Split("", " capital")


@pytest.mark.parametrize(
    ("parser", "prompt_end", "thinking"),
    [
        ("qwen3", "<|im_start|>assistant\n", False),
        ("qwen3", "<|im_start|>assistant\n<think>\n", True),  # a template that opens it
        ("deepseek_r1", "<|im_start|>assistant\n<think>\n", True),
        ("deepseek_r1", "<|im_start|>assistant\n", True),  # R1 thinks first
        ("deepseek_r1", "<think>\n\n</think>\n\n", False),  # the template closed it
    ],
)
def test_the_prompt_decides_where_the_output_starts(
    parser: str, prompt_end: str, thinking: bool
) -> None:
    splitter = splitter_for(parser, "<|im_start|>user\nHi<|im_end|>\n" + prompt_end, None, False)
    assert splitter is not None
    got = run(splitter, ["Paris."])
    assert got == (Split("Paris.", "") if thinking else Split("", "Paris."))


@pytest.mark.parametrize(
    ("parser", "kwargs", "constrained"),
    [
        (None, None, False),
        ("qwen3", {"enable_thinking": False}, False),
        ("deepseek_r1", {"thinking": False}, False),
        ("qwen3", None, True),  # a grammar shapes the output: no thinking in it
    ],
)
def test_no_split_when_thinking_is_off(
    parser: str | None, kwargs: dict[str, bool] | None, constrained: bool
) -> None:
    assert splitter_for(parser, "", kwargs, constrained) is None


def test_enable_thinking_true_still_splits() -> None:
    assert splitter_for("qwen3", "", {"enable_thinking": True}, False) is not None
