"""bench.prefill_cpu on the default model, both comparisons: every round of each variant
prefills, and the JSON carries each variant's times and ratios to the same run's peaks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.prefill_cpu import main
from engine import cpu_kernels


@pytest.mark.parametrize(
    ("compare", "variants"),
    [("kernel", {"c_kernel", "torch_sdpa"}), ("precision", {"medium", "highest"})],
)
def test_both_variants_are_timed(
    compare: str, variants: set[str], tmp_path: Path, default_model_dir: Path
) -> None:
    if not cpu_kernels.available():
        pytest.skip("no C compiler: the benchmark has nothing to compare")
    out = tmp_path / "prefill.json"
    argv = ["--tokens", "40", "--rounds", "2", "--threads", "1", "--compare", compare]
    assert main([*argv, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["prefill_ms_best"]) == variants
    assert all(len(v) == 2 and min(v) > 0 for v in result["prefill_ms_all"].values())
    peaks = {"fp32", "bf16"} if compare == "precision" else {"fp32"}
    assert set(result["matmul_peak_gflop_s"]) == peaks
    assert len(result["ratio_to_matmul_peak"]) == len(variants) * len(peaks)
    assert result["speedup"] > 0
