"""bench.cpu_kernels runs end to end on a small shape and writes its figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import cpu_kernels


def test_small_run_writes_ratios(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cpu.json"
    args = [
        "--seqs",
        "3",
        "--min-ctx",
        "5",
        "--max-ctx",
        "40",
        "--layers",
        "2",
        "--rows",
        "4",
        "--packed-rows",
        "3",
        "--prefill-lens",
        "48",
        "--prefill-repeats",
        "2",
        "--out",
        str(out),
    ]
    assert cpu_kernels.main(args) == 0
    result = json.loads(out.read_text())
    attention = result["attention"]
    assert attention["memcpy_gb_s"] > 0
    assert attention["torch_gather_sdpa"]["ratio_to_memcpy"] > 0
    assert result["linear"]["rows_4"]["f_linear_ratio_to_peak"] > 0
    packed = result["packed_linear"]["rows_3"]
    assert packed["packed_ratio_to_bf16_peak"] > 0 and packed["torch_bf16_gflop_s"] > 0
    assert packed["packed_ratio_to_fp32_peak"] > 0
    printed = capsys.readouterr().out
    assert "ratio to memcpy" in printed and "packed as Q4_1" in printed


def test_one_part_alone(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    args = ["--layers", "1", "--packed-rows", "2", "--only", "packed", "--out", str(out)]
    assert cpu_kernels.main(args) == 0
    result = json.loads(out.read_text())
    assert "attention" not in result and "linear" not in result
    packed = result["packed_linear"]
    assert packed["rows_2"]["fp32_kernel_gflop_s"] > 0
    assert packed["rows_2"]["packed_cpu_ratio_to_fp32_peak"] > 0  # per CPU-second too
    assert packed["prefill_blocking"]["k_576"]["inputs"] >= 16  # the host's blocks, shown


def test_bad_lengths_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cpu_kernels.main(["--min-ctx", "100", "--max-ctx", "50"])
    assert "--min-ctx 100" in capsys.readouterr().err
