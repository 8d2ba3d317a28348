"""bench.moe runs end to end on a small layer and writes its figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import moe


def test_small_run_writes_ratios(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "moe.json"
    args = ["--hidden", "32", "--inter", "16", "--experts", "8", "--top-k", "2"]
    args += ["--tokens", "1", "3", "--calls", "2", "--batches", "2", "--out", str(out)]
    assert moe.main(args) == 0
    result = json.loads(out.read_text())
    assert result["matmul_peak_gflop_s"] > 0 and result["memcpy_gb_s"] > 0
    for tokens in (1, 3):
        row = result["results"][f"tokens_{tokens}"]
        assert 1 <= row["experts_hit"] <= min(8, 2 * tokens)
        assert row["torch"]["ratio_to_dense"] > 0
    assert "ratio to dense" in capsys.readouterr().out


def test_bad_sizes_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        moe.main(["--experts", "4", "--top-k", "8"])
    assert "--top-k 8 is above --experts 4" in capsys.readouterr().err
