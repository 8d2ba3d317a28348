"""The acceptance table learns which kinds of guesses hold (engine.speculative.acceptance)."""

from __future__ import annotations

import itertools

import pytest

from engine.speculative.acceptance import AcceptanceTable


def test_a_kind_that_holds_is_worth_more_than_one_that_fails() -> None:
    table = AcceptanceTable(k=4)
    for _ in range(30):
        table.record("long match", proposed=4, accepted=4)
        table.record("short match", proposed=4, accepted=0)
    good, bad = table.gains("long match", 4), table.gains("short match", 4)
    assert good[0] > 0.9 and good[3] > 0.8
    assert bad[0] < 0.1
    for gains in (good, bad, table.gains("never seen", 4)):
        assert all(x >= y for x, y in itertools.pairwise(gains))  # non-increasing


def test_a_rejection_ends_the_guesses_it_reached() -> None:
    table = AcceptanceTable(k=4)
    for _ in range(40):
        table.record("kind", proposed=4, accepted=1)  # guess 1 holds, guess 2 fails
    gains = table.gains("kind", 4)
    assert gains[0] > 0.9
    assert gains[1] < 0.1  # guess 2 never held
    # guesses 3 and 4 were never verified (guess 2 failed first): they keep the prior
    assert gains[2] == pytest.approx(gains[1] * 0.5)
    assert gains[3] == pytest.approx(gains[2] * 0.5)


def test_it_follows_a_change_in_the_traffic() -> None:
    table = AcceptanceTable(k=2)
    for _ in range(50):
        table.record("kind", proposed=2, accepted=2)
    assert table.gains("kind", 1)[0] > 0.9
    for _ in range(50):
        table.record("kind", proposed=2, accepted=0)
    assert table.gains("kind", 1)[0] < 0.4  # the old successes have faded


def test_a_kind_unverified_for_long_starts_again_from_the_prior() -> None:
    table = AcceptanceTable(k=1)
    for _ in range(20):
        table.record("kind", proposed=1, accepted=0)
    assert table.gains("kind", 1)[0] < 0.1
    table.step += 1000
    assert table.gains("kind", 1) == table.gains("unknown", 1) == [0.5]
