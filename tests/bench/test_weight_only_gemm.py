"""bench.weight_only_gemm runs end to end (on CPU: a tiny interpreted case) and writes its
JSON: every product, the crossover and the sweep, each kernel close to cuBLAS's answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from bench.weight_only_gemm import main


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU this is the real benchmark")
def test_writes_figures_marked_meaningless_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gemm.json"
    assert main(["--out", str(out), "--crossover", "--sweep"]) == 0
    result = json.loads(out.read_text())
    assert result["meaningful"] is False
    assert [c["m"] for c in result["cases"]] == [1, 3]
    for case in result["cases"]:
        # at decode rows the decode kernel, and the tiled kernel beside it
        assert case["w4a16_kernel"] == "decode"
        for kind in ("w4a16", "w4a16_tiled", "fp8"):
            assert case[kind]["rel_err_vs_cublas"] < 1e-2  # half-precision activations
            assert case[kind]["weight_bytes"] < case["bf16"]["weight_bytes"]
            assert case[kind]["speedup_vs_bf16"] > 0
    (crossing,) = result["crossover"]["tiny"]
    assert crossing["w4a16"]["fused_ms"] > 0 and crossing["fp8"]["dequant_ms"] > 0
    kinds = {s["kind"] for s in result["sweep"]["tiny"]}
    assert kinds == {"w4a16_tiled", "w4a16_decode", "fp8"}
    assert all(s["plan"]["ms"] > 0 for s in result["sweep"]["tiny"])
