"""The guess budget follows the fitted step cost (engine.speculative.cost)."""

from __future__ import annotations

from engine.speculative.cost import StepCost


def _fitted(a: float, b: float) -> StepCost:
    cost = StepCost()
    for tokens in (1, 2, 5, 8, 10, 16, 20, 40):
        cost._samples.append((float(tokens), a + b * tokens))
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


def test_without_a_fit_every_guess_is_tried() -> None:
    assert StepCost().allocate(3, [[0.1, 0.01], [0.5]]) == [2, 1]
