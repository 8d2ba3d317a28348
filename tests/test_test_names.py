"""The suite collects: tests/ has no packages, so pytest imports each test module by its
basename, and two modules of one basename stop the whole run at collection."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_every_test_module_has_a_basename_of_its_own() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
