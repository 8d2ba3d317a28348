"""The checker: each answer of a faulty run against the same request's fault-free greedy answer.

A request is
- identical: status 200, no error, and every choice has exactly the expected tokens (in
  stream order: a repeated or missing token differs), text and finish reason;
- failed clearly: a retriable error (429, 503, or the deadline's 408 / 504, with the OpenAI
  error body; or an SSE error event after tokens that are a prefix of the expected ones)
  within the deadline, or no connection to the router at all (a router restarting: the
  request was never sent);
- tie: identical up to a token where the two best choices were a near-tie (both runs list
  both tokens among their top two, within TIE_NATS of each other) and the runs took
  different ones; the tokens after it follow from that choice and are not compared. A
  request recomputed after a fault (a failed KV read, a resume on another decode node)
  computes the same values in another order, and float sums in another order may break a
  near-tie the other way;
- hung: no end within the deadline (and the client's grace);
- lost: anything else (other tokens, an unclear error, a cut stream without an error event).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Literal

from bench.chaos.client import Outcome

Kind = Literal["identical", "tie", "failed_clearly", "lost", "hung"]
TIE_NATS = 0.01
RETRIABLE = frozenset({408, 429, 503, 504})
LATE_MARGIN_S = 2.0  # the router's clock starts a moment after the client's


@dataclass(frozen=True)
class Verdict:
    index: int
    kind: Kind
    why: str = ""


def judge(got: Outcome, expected: Outcome, deadline_s: float) -> Verdict:
    if got.hung:
        return Verdict(got.index, "hung", "no end within the deadline")
    if got.refused is not None:
        return Verdict(got.index, "failed_clearly", f"not sent: {got.refused}")
    if got.broken is not None:
        return Verdict(got.index, "lost", got.broken)
    if got.ended - got.started > deadline_s + LATE_MARGIN_S:
        return Verdict(got.index, "hung", f"ended after {got.ended - got.started:.1f}s")
    if got.status != 200:
        return _refused(got)
    cut = got.error is not None
    if not cut and len(got.tokens) != len(expected.tokens):
        return Verdict(got.index, "lost", f"{len(got.tokens)} choices, not {len(expected.tokens)}")
    ties = []
    for i in range(len(got.tokens)):
        wrong, tie = _compare(got, expected, i, cut)
        if wrong:
            return Verdict(got.index, "lost", f"choice {i}: {wrong}")
        ties += [f"choice {i}: {tie}"] if tie else []
    if cut:
        return Verdict(got.index, "failed_clearly", f"SSE error {_code(got)}")
    return Verdict(got.index, "tie", "; ".join(ties)) if ties else Verdict(got.index, "identical")


def _refused(got: Outcome) -> Verdict:
    if got.status in RETRIABLE and got.error is not None and "message" in got.error:
        return Verdict(got.index, "failed_clearly", f"HTTP {got.status} {_code(got)}")
    return Verdict(got.index, "lost", f"HTTP {got.status} {got.error}")


def _code(got: Outcome) -> str:
    return str((got.error or {}).get("code"))


def _compare(got: Outcome, expected: Outcome, i: int, cut: bool) -> tuple[str, str]:
    """(how choice i differs for real, where it broke a near-tie): both '' when identical.
    A `cut` choice (an error ended it) may stop short."""
    if i >= len(expected.tokens):
        return "not expected", ""
    tokens, want = got.tokens[i], expected.tokens[i]
    at = next((k for k, (a, b) in enumerate(zip(tokens, want, strict=False)) if a != b), None)
    if at is not None:
        gaps = [_gap(run.alternatives[i][at], tokens[at], want[at]) for run in (got, expected)]
        if any(g is None or g > TIE_NATS for g in gaps):
            return f"token {at} differs ({len(tokens)} tokens, expected {len(want)})", ""
        return "", f"token {at} broke a near-tie the other way (gaps {gaps[0]:.2g}, {gaps[1]:.2g})"
    if cut:
        return ("", "") if len(tokens) <= len(want) else ("more tokens than expected", "")
    if len(tokens) != len(want):
        return f"{len(tokens)} tokens, expected {len(want)}", ""
    if (got.texts[i], got.finish[i]) != (expected.texts[i], expected.finish[i]):
        return "the same tokens, another text or finish reason", ""
    return "", ""


def _gap(top: dict[str, float], a: str, b: str) -> float | None:
    """How far apart the logprobs of tokens `a` and `b` were (None: not both in `top`)."""
    return abs(top[a] - top[b]) if a in top and b in top else None


def tally(verdicts: list[Verdict]) -> Counter[str]:
    counts: Counter[str] = Counter(dict.fromkeys(("identical", "tie", "failed_clearly"), 0))
    counts.update({"lost": 0, "hung": 0})
    counts.update(v.kind for v in verdicts)
    return counts


def check_baseline(outcomes: list[Outcome]) -> None:
    """The fault-free run must answer every request: RuntimeError naming the first that
    did not (the chaos run would have nothing to compare with)."""
    for out in outcomes:
        if out.hung or out.broken or out.status != 200 or out.error or not out.tokens:
            raise RuntimeError(
                f"the fault-free run failed request {out.index}: status={out.status} "
                f"error={out.error} broken={out.broken} hung={out.hung}"
            )
