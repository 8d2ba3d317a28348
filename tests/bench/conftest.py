"""The bench tests drive the engine with the tiny random Llama of tests/engine."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))


@pytest.fixture(autouse=True)
def short_peaks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The benches' matmul peaks run 0.2 s here, not 2 s: the tests check what the benches
    report and write, not how precisely this machine's peak is known."""
    import bench.common

    monkeypatch.setattr(bench.common, "PEAK_SECONDS", 0.2)
