"""bench.kernels runs end to end (on CPU: the tiny interpreted config) and writes its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.kernels import main

pytest.importorskip("triton")


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU this is the real benchmark")
def test_kernel_bench_writes_figures_marked_meaningless_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "kernels.json"
    assert main(["--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["meaningful"] is False and result["meets_limit"] is False
    assert result["decode"]["max_abs_err_vs_reference"] < 1e-4
    assert result["decode"]["bytes"] == result["copy"]["bytes"] > 0
    assert result["prefill"]["time_ms"] > 0
