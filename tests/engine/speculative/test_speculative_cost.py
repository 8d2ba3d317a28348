"""The guess budget follows the fitted step cost (engine.speculative.cost)."""

from __future__ import annotations

import itertools

import pytest

from engine.speculative.cost import StepCost


def _fitted(a: float, b: float) -> StepCost:
    cost = StepCost()
    for tokens in (1, 2, 5, 8, 10, 16, 20, 40):
        cost.target.add(tokens, a + b * tokens)
    return cost


def test_fit_recovers_the_line() -> None:
    fit = _fitted(0.05, 0.002).fit()
    assert fit is not None
    assert abs(fit[0] - 0.05) < 1e-9 and abs(fit[1] - 0.002) < 1e-9


def test_memory_bound_steps_take_every_likely_guess() -> None:
    cost = _fitted(0.05, 0.0005)  # a token costs 1% of a step
    gains = [[0.8, 0.64, 0.51, 0.41], [0.3, 0.09, 0.027, 0.008]]
    assert cost.allocate(2, gains) == [4, 2]  # the third of the second: 0.027 < b T / C


def test_compute_bound_steps_take_only_near_certain_guesses() -> None:
    cost = _fitted(0.001, 0.01)  # time grows with every token
    assert cost.allocate(8, [[0.5, 0.25]] * 8) == [0] * 8
    assert cost.allocate(8, [[0.995, 0.99]] + [[0.1]] * 7) == [2] + [0] * 7


def test_without_a_fit_every_guess_is_tried_every_other_step() -> None:
    cost = StepCost()
    assert cost.allocate(3, [[0.1, 0.01], [0.5]]) == [0, 0]
    assert cost.allocate(3, [[0.1, 0.01], [0.5]]) == [2, 1]


def _with_draft(cost: StepCost, a: float, b: float) -> StepCost:
    for rows in (1, 2, 4, 8, 3, 6, 5, 7):
        cost.draft.add(rows, a + b * rows)
    return cost


def test_a_draft_forward_as_dear_as_the_target_is_not_run() -> None:
    # the target as its own draft: every guess holds, but each depth costs a whole step
    cost = _with_draft(_fitted(0.03, 0.002), 0.03, 0.002)
    assert cost.allocate(4, [[0.99] * 4] * 4, draft=True) == [0] * 4


def test_a_cheap_draft_guesses_deep_where_guesses_hold() -> None:
    cost = _with_draft(_fitted(0.03, 0.0005), 0.002, 0.0001)
    gains = [[0.9, 0.8, 0.7, 0.6], [0.2, 0.04, 0.01, 0.0]]
    # the second request's first guess rides on a draft forward the first one pays for
    assert cost.allocate(2, gains, draft=True) == [4, 1]


def test_until_the_line_is_drawn_steps_with_and_without_guesses_take_turns() -> None:
    cost = StepCost()
    for _ in range(10):
        cost.target.add(20, 0.05)  # every step had 4 guesses for each of 4 requests
    got = [cost.allocate(4, [[0.9] * 4] * 4) for _ in range(16)]
    assert got == [[0] * 4, [4] * 4] * 8


def test_a_draft_judged_too_dear_is_tried_again_later() -> None:
    cost = _with_draft(_fitted(0.03, 0.002), 0.03, 0.002)
    gains = [[], [0.99] * 4, [0.99] * 4]
    got = [cost.allocate(3, gains, True, [0, 300, 40]) for _ in range(1000)]
    probes = [n for n, counts in enumerate(got) if any(counts)]
    # one guess for the request least behind; the wait doubles while nothing changes
    assert all(got[n] == [0, 0, 1] for n in probes)
    assert [b - a for a, b in itertools.pairwise(probes)] == [129, 257, 513]


def test_a_request_the_draft_is_far_behind_on_waits() -> None:
    cost = _with_draft(_fitted(0.03, 0.0005), 0.002, 0.0001)
    gains = [[0.9, 0.8], [0.9, 0.8]]
    # the second request's prompt is not in the draft's cache yet: 500 tokens to catch up on
    assert cost.allocate(2, gains, draft=True, behind=[1, 500]) == [2, 0]
    assert cost.allocate(2, gains, draft=True, behind=[1, 1]) == [2, 2]


def test_catching_up_is_paid_over_the_steps_a_request_has_left() -> None:
    cost = _with_draft(_fitted(0.03, 0.0005), 0.002, 0.0001)
    gains = [[0.9, 0.8], [0.9, 0.8]]
    # 500 tokens to catch up on are worth it for 400 more tokens (148 steps at 2.7 tokens
    # each), not for 6 (this step and one more)
    assert cost.allocate(2, gains, True, behind=[1, 500], remaining=[400, 400]) == [2, 2]
    assert cost.allocate(2, gains, True, behind=[1, 500], remaining=[400, 6]) == [2, 0]


def test_a_new_draft_guesses_for_a_few_requests_until_its_line_is_drawn() -> None:
    cost = _fitted(0.03, 0.002)
    gains = [[0.9] * 3] * 6 + [[]]
    behind = [60, 10, 50, 20, 40, 30, 0]
    got = [cost.allocate(7, gains, True, behind) for _ in range(3)]
    # the requests the draft is least behind on, 1, then 2, then 4 (the last asks nothing)
    assert got == [
        [0, 3, 0, 0, 0, 0, 0],
        [0, 3, 0, 3, 0, 0, 0],
        [0, 3, 0, 3, 3, 3, 0],
    ]


def test_steps_that_all_have_one_size_keep_the_last_line() -> None:
    cost = _fitted(0.03, 0.002)
    for _ in range(64):
        cost.target.add(8, 0.046)  # guesses declined for a while: every step plain
    assert cost.fit() == pytest.approx((0.03, 0.002))
