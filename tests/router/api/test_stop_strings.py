"""Stop strings over streamed text, whatever the chunking."""

from __future__ import annotations

import random

import pytest

from router.api.stop_strings import StopMatcher


def _run(chunks: list[str], stops: list[str]) -> tuple[str, bool]:
    matcher, out = StopMatcher(stops), []
    for chunk in chunks:
        text, stopped = matcher.feed(chunk)
        out.append(text)
        if stopped:
            return "".join(out), True
    return "".join(out) + matcher.flush(), False


def test_stop_string_split_across_chunks_is_found() -> None:
    assert _run(["Hello wo", "rl", "d and more"], ["world"]) == ("Hello ", True)


def test_possible_prefix_is_held_back_then_released() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("abc ST") == ("abc ", False)  # "ST" might start STOP
    assert matcher.feed("ART S") == ("START ", False)  # "S" might start STOP
    assert matcher.feed("TOP!") == ("", True)


def test_flush_returns_the_held_tail_at_the_end() -> None:
    matcher = StopMatcher(["\n\n"])
    assert matcher.feed("line\n") == ("line", False)
    assert matcher.flush() == "\n"


def test_earliest_of_several_stops_wins() -> None:
    assert _run(["one two three"], ["three", "two"]) == ("one ", True)
    assert _run(["aXbY"], ["Y", "X"]) == ("a", True)


def test_nothing_is_emitted_after_a_stop() -> None:
    matcher = StopMatcher(["x"])
    assert matcher.feed("ax") == ("a", True)
    assert matcher.feed("more") == ("", True)
    assert matcher.flush() == ""


def test_without_stops_text_passes_through() -> None:
    matcher = StopMatcher([])
    assert matcher.feed("anything") == ("anything", False)


def test_empty_stop_string_is_refused() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        StopMatcher(["ok", ""])


@pytest.mark.parametrize("seed", range(20))
def test_any_chunking_gives_the_text_before_the_first_stop(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = "ab c"
    text = "".join(rng.choice(alphabet) for _ in range(60))
    stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(2)]
    cuts = sorted(rng.sample(range(1, len(text)), 8))
    chunks = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    hits = [i for s in stops if (i := text.find(s)) >= 0]
    expected = (text[: min(hits)], True) if hits else (text, False)
    assert _run(chunks, stops) == expected
