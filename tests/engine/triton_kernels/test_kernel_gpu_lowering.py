"""Every kernel of engine.triton_kernels lowers to a cubin for sm_90, checked without a GPU,
as its launcher launches it (gpu_lowering.py).

The interpreter runs programs that the GPU compiler would reject; this catches those in CI.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

SCRIPT = Path(__file__).with_name("gpu_lowering.py")
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tests compile the kernels")
@pytest.mark.skipif(not PTXAS.exists(), reason="triton wheel without the bundled ptxas")
def test_kernels_compile_for_hopper() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--arch", "90"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    compiled = {line.split()[1] for line in done.stdout.splitlines() if line.startswith("ok ")}
    counts = re.search(r"^kernels (\d+)/(\d+)$", done.stdout, re.M)
    assert counts and counts[1] == counts[2] and len(compiled) == int(counts[2]) >= 12, done.stdout
    assert {"_decode_split_kernel", "_prefill_kernel", "_fused_kernel", "_down_kernel"} <= compiled
    assert "_mla_kernel" in compiled
    assert "quant=1" in done.stdout and "quant=2" in done.stdout
    # the attentions read a quantized cache's rows in 8-byte pieces, never byte by byte (the
    # byte loads had made int8 decode ~17x slower than a bf16 cache on an H200)
    for line in done.stdout.splitlines():
        if line.startswith(("ok _decode_split_kernel", "ok _prefill_kernel", "ok _mla_kernel")):
            assert line.endswith("byte_loads=0"), line
