"""The load predictor extends the recent trend and never predicts negative load."""

from __future__ import annotations

import pytest

from planner.predict import TrendPredictor


def test_a_rising_load_is_predicted_ahead() -> None:
    p = TrendPredictor(history=4, horizon=2)
    for load in (100, 200, 300, 400):
        p.add(load)
    assert p.predict() == pytest.approx(600)


def test_a_falling_load_stops_at_zero_and_short_histories_repeat_the_last() -> None:
    p = TrendPredictor(history=3, horizon=5)
    assert p.predict() == 0.0
    p.add(50)
    assert p.predict() == 50
    for load in (40, 20, 0):
        p.add(load)
    assert p.predict() == 0.0
    assert p.peak() == 40  # the last 3


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="history"):
        TrendPredictor(history=1, horizon=1)
