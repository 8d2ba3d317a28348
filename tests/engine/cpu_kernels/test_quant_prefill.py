"""The packed product's prefill kernel (quant_prefill.c) is blocked for the caches the build
reads from the host, and whatever the blocks, it computes what the fp32 kernel computes over
the dequantized weights, bit for bit (test_quant_linear.py checks the host's build; here
builds for small caches at both vector widths split K, the rows and the panels many ways)."""

from __future__ import annotations

import ctypes
import importlib
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from engine import cpu_kernels
from engine.cpu_kernels.quant_linear import prefill_blocking
from tests.engine.cpu_kernels.test_quant_linear import random_weight

build = importlib.import_module("engine.cpu_kernels.build")  # the package re-exports build()
pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C compiler")
KERNELS = Path(cpu_kernels.__file__).parent
SOURCES = ("quant_linear.c", "quant_prefill.c", "quant_amx.c", "quant_amx_bf16.c", "linear.c")
# (bits, group, mins, N, K): an odd number of panels; K across several blocks of inputs
CASES = [(4, 32, True, 80, 160), (8, 16, False, 48, 272), (4, 128, True, 32, 384)]
ROWS = [7, 13, 48, 61, 100]


def _fake_sysfs(root: Path, caches: list[tuple[str, str, str]]) -> Path:
    for i, (level, kind, size) in enumerate(caches):
        index = root / f"index{i}"
        index.mkdir(parents=True)
        for name, text in (("level", level), ("type", kind), ("size", size)):
            (index / name).write_text(text + "\n")
    return root


def test_the_build_reads_the_hosts_cache_sizes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    caches = [("1", "Data", "48K"), ("1", "Instruction", "32K"), ("2", "Unified", "2M"),
              ("3", "Unified", "32768K")]  # fmt: skip
    monkeypatch.setattr(build, "CACHE_SYSFS", str(_fake_sysfs(tmp_path, caches)))
    assert build.host_cache_bytes() == {"L1D": 48 << 10, "L2": 2 << 20}
    assert build.cache_flags() == ("-DSPLITSERVE_L1D_BYTES=49152", "-DSPLITSERVE_L2_BYTES=2097152")


def test_the_hosts_build_blocks_within_its_caches() -> None:
    sizes = build.host_cache_bytes()
    l1, l2 = sizes.get("L1D", 32 << 10), sizes.get("L2", 1 << 20)
    for k in (576, 1536):
        b = prefill_blocking(k)
        assert b.panels * 64 * b.inputs <= l1 // 2 < b.panels * 64 * (b.inputs + 16)
        assert b.row_block % b.rows == 0 and b.row_block * k * 4 <= l2 // 2


def _library(tmp_path: Path, width: int, l1: int, l2: int) -> ctypes.CDLL:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    lib_path = tmp_path / f"quant_{width}_{l1}_{l2}.so"
    flags = ["-O2", "-std=gnu11", "-ffp-contract=fast", "-fPIC", "-shared", "-fopenmp",
             "-Wno-psabi", "-march=native", f"-DSPLITSERVE_VEC_WIDTH={width}",
             f"-DSPLITSERVE_L1D_BYTES={l1}", f"-DSPLITSERVE_L2_BYTES={l2}"]  # fmt: skip
    sources = [str(KERNELS / n) for n in SOURCES]
    subprocess.run([cc, *flags, "-o", str(lib_path), *sources, "-lm"], check=True, timeout=300)
    lib = ctypes.CDLL(str(lib_path))
    i64, i32, p = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
    lib.splitserve_linear_quant.argtypes = [p, i64, p, p, p, *[i32] * 6, p, i64, *[i32] * 4]
    lib.splitserve_linear_f32.argtypes = [p, i64, p, i32, i32, i32, p, i64, i32, i32]
    lib.splitserve_quant_prefill_blocking.argtypes = [i32, p]
    return lib


@pytest.mark.parametrize("width", [8, 16])
def test_small_caches_give_small_blocks_and_the_same_bits(tmp_path: Path, width: int) -> None:
    lib = _library(tmp_path, width, l1=8 << 10, l2=64 << 10)
    blocks = (ctypes.c_int32 * 4)()
    lib.splitserve_quant_prefill_blocking(160, blocks)
    panels = 2 if width == 16 else 1
    assert list(blocks) == [12 if width == 16 else 6, panels, 4096 // (panels * 64), 48]
    for bits, group, mins, n, k in CASES:
        weight = random_weight(n, k, bits, group, mins, seed=n + k)
        packed = cpu_kernels.pack_linear_weight(weight.dequantize())
        assert packed is not None
        mins_ptr = None if weight.mins is None else weight.mins.data_ptr()
        halves = int(weight.scales.dtype == torch.float16) | (
            2 if weight.mins is not None and weight.mins.dtype == torch.float16 else 0
        )
        for m in ROWS:
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
            for accumulate in (0, 1):
                got, want = torch.full((m, n), 0.5), torch.full((m, n), 0.5)
                lib.splitserve_linear_quant(
                    x.data_ptr(), k, weight.codes.data_ptr(), weight.scales.data_ptr(), mins_ptr,
                    halves, bits, group, m, n, k, got.data_ptr(), n, accumulate, 2, 0, 0,
                )  # fmt: skip
                lib.splitserve_linear_f32(
                    x.data_ptr(), k, packed.data_ptr(), m, n, k, want.data_ptr(), n, accumulate, 2
                )
                assert torch.equal(got, want), (width, bits, m, accumulate)
