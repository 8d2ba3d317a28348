"""The chaos checker (bench.chaos.checker) on made-up answers: what counts as identical, a
near-tie, a clear failure, lost or hung."""

from __future__ import annotations

import pytest

from bench.chaos.checker import TIE_NATS, judge, tally
from bench.chaos.client import Outcome
from bench.chaos.workload import make_specs

DEADLINE_S = 60.0
WANT = ["The", " old", " river"]


def _answer(
    tokens: list[str],
    *,
    status: int | None = 200,
    seconds: float = 1.0,
    top: dict[str, float] | None = None,
    **fields: object,
) -> Outcome:
    """An answer with `tokens` as choice 0; `top`: each token's best alternatives."""
    out = Outcome(index=0, started=100.0, ended=100.0 + seconds, status=status)
    out.choice(0)
    out.tokens[0] = list(tokens)
    out.alternatives[0] = [top or {t: -0.1} for t in tokens]
    out.texts[0] = "".join(tokens)
    out.finish[0] = "length"
    for key, value in fields.items():
        setattr(out, key, value)
    return out


def _kind(got: Outcome) -> str:
    return judge(got, _answer(WANT), DEADLINE_S).kind


def test_the_same_tokens_are_identical() -> None:
    assert _kind(_answer(WANT)) == "identical"


@pytest.mark.parametrize(
    "tokens",
    [
        ["The", " old", " old", " river"],  # a token repeated (a resume streamed it twice)
        ["The", " river"],  # a token missing
        ["The", " old", " sea"],  # another token, far from a tie
    ],
)
def test_repeated_missing_or_other_tokens_are_lost(tokens: list[str]) -> None:
    assert _kind(_answer(tokens)) == "lost"


def test_tokens_then_an_error_event_fail_clearly_only_when_they_match() -> None:
    error = {"message": "node gone", "code": "no_healthy_node"}
    assert _kind(_answer(WANT[:2], error=error)) == "failed_clearly"
    assert _kind(_answer(["The", " sea"], error=error)) == "lost"


@pytest.mark.parametrize(("status", "kind"), [(503, "failed_clearly"), (429, "failed_clearly"),
                                              (504, "failed_clearly"), (500, "lost")])  # fmt: skip
def test_an_error_status_is_clear_when_retriable(status: int, kind: str) -> None:
    got = _answer([], status=status, error={"message": "m", "code": "c"})
    assert _kind(got) == kind


def test_no_answer_in_time_is_hung_and_a_cut_stream_is_lost() -> None:
    assert _kind(_answer([], status=None, hung=True)) == "hung"
    assert _kind(_answer(WANT, seconds=DEADLINE_S + 5)) == "hung"
    assert _kind(_answer(WANT[:1], broken="the stream ended without [DONE]")) == "lost"


def test_a_near_tie_broken_the_other_way_is_a_tie_not_lost() -> None:
    close = {" river": -0.70, " sea": -0.70 - TIE_NATS / 2}
    expected = _answer(WANT, top=close)
    assert judge(_answer(["The", " old", " sea"], top=close), expected, DEADLINE_S).kind == "tie"
    far = {" river": -0.1, " sea": -3.0}
    assert judge(_answer(["The", " old", " sea"], top=far), expected, DEADLINE_S).kind == "lost"


def test_tally_counts_every_kind() -> None:
    verdicts = [judge(_answer(WANT), _answer(WANT), DEADLINE_S)] * 2
    assert tally(verdicts) == {"identical": 2, "tie": 0, "failed_clearly": 0, "lost": 0, "hung": 0}


def test_the_mix_is_fixed_by_its_seed_and_has_every_kind_of_request() -> None:
    specs = make_specs(200, seed=3)
    assert [s.body for s in specs] == [s.body for s in make_specs(200, seed=3)]
    assert {s.stream for s in specs} == {True, False} and {s.chat for s in specs} == {True, False}
    assert max(s.n for s in specs) > 1
    words = [len(str(s.body.get("prompt") or s.body["messages"])) for s in specs]
    assert min(words) < 100 < 1000 < max(words)  # short prompts (local prefill) and long ones
