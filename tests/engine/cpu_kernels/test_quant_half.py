"""Scales and mins kept in fp16 (where fp16 holds them exactly) give the packed linear kernel's
results bit for bit as the fp32 storage, on every path: the small-row kernel (1, 3, 4 rows),
the FMA path or the AMX tiles (8, 32 rows) and the FMA path alone (amx_rows=0); with fp16
scales and fp32 mins too (GPTQ's mins are not exact in fp16). Each C build target (no
-march, AVX2 + FMA without F16C, -march=native at 8 lanes and at the machine's width) is
compiled here and checked the same way, so the portable fp16 conversion runs too."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from engine import cpu_kernels
from engine.cpu_kernels.quant_linear import quant_linear
from engine.model.quant.weight import QuantWeight, RowQuant

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C compiler")
KERNELS = Path(cpu_kernels.__file__).parent
ROWS = [1, 3, 4, 8, 32]
# (bits, group, scales, mins, N, K); scales and mins: "half" exact in fp16 (some of them
# subnormal, zero or negative), "float" not, None no mins
CASES = [
    (4, 32, "half", "half", 48, 96),
    (8, 32, "half", None, 80, 160),
    (4, 64, "half", "float", 32, 192),
    (8, 16, "float", "half", 48, 272),
]


def params(n: int, g: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    t = torch.randn(n, g, generator=gen) * 0.02
    if kind == "float":
        return t
    t = t.half().float()
    t[0, :] = torch.arange(g) * 2.0**-24  # fp16 subnormals (and a zero)
    t[1, 0] = -0.0
    return t


def rows_of(bits: int, group: int, scales: str, mins: str | None, n: int, k: int) -> RowQuant:
    gen = torch.Generator().manual_seed(n + k + bits)
    low, high, dtype = (0, 16, torch.uint8) if bits == 4 else (-128, 128, torch.int8)
    codes = torch.randint(low, high, (n, k), generator=gen).to(dtype)
    m = None if mins is None else params(n, k // group, mins, gen)
    return RowQuant(codes, params(n, k // group, scales, gen), m, bits, group)


@pytest.mark.parametrize(("bits", "group", "scales", "mins", "n", "k"), CASES)
def test_packing_keeps_fp16_where_exact(
    bits: int, group: int, scales: str, mins: str | None, n: int, k: int
) -> None:
    q = rows_of(bits, group, scales, mins, n, k)
    half, full = QuantWeight(q), QuantWeight(q, half_scales=False)
    want = torch.float16 if scales == "half" else torch.float32
    assert half.scales.dtype == want and full.scales.dtype == torch.float32
    if mins is not None:
        assert half.mins is not None and full.mins is not None
        assert half.mins.dtype == (torch.float16 if mins == "half" else torch.float32)
        assert torch.equal(half.mins.float(), full.mins)
    assert torch.equal(half.scales.float(), full.scales)
    saved = sum(
        t.numel() * 2
        for t in (half.scales, half.mins)
        if t is not None and t.dtype == torch.float16
    )
    assert half.nbytes == full.nbytes - saved and saved > 0
    assert torch.equal(half.dequantize(), q.dequantize())
    assert torch.equal(half.rows(torch.tensor([0, 1, n - 1])), q.dequantize()[[0, 1, n - 1]])


@pytest.mark.parametrize(("bits", "group", "scales", "mins", "n", "k"), CASES)
def test_fp16_storage_gives_the_same_bits(
    bits: int, group: int, scales: str, mins: str | None, n: int, k: int, threads: int
) -> None:
    q = rows_of(bits, group, scales, mins, n, k)
    half, full = QuantWeight(q), QuantWeight(q, half_scales=False)
    gen = torch.Generator().manual_seed(threads)
    for m in ROWS:
        x = torch.randn(m, k, generator=gen)
        h = torch.randn(m, n, generator=gen)
        for amx_rows in (1, 0):
            for out in (None, h):
                a, b = (
                    quant_linear(x, w.codes, w.scales, w.mins, bits, group,
                                 out=None if out is None else out.clone(), amx_rows=amx_rows)
                    for w in (half, full)
                )  # fmt: skip
                assert torch.equal(a, b), (m, amx_rows, out is None)
        assert torch.equal(half.linear(x), full.linear(x)), m


TARGETS = {
    "portable": (),
    "avx2": ("-mavx2", "-mfma"),
    "native8": ("-march=native", "-DSPLITSERVE_VEC_WIDTH=8"),
    "native": ("-march=native",),
}


def _cpu_flags() -> str:
    try:
        return Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return ""


@pytest.mark.parametrize("target", list(TARGETS))
def test_each_build_target_reads_fp16(target: str, tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    if target == "avx2" and not (" avx2" in _cpu_flags() and " fma" in _cpu_flags()):
        pytest.skip("no AVX2 + FMA here")
    if target != "portable" and not _cpu_flags():
        pytest.skip("no /proc/cpuinfo: cannot tell what -march=native targets")
    lib_path = tmp_path / f"quant_{target}.so"
    names = ("quant_linear.c", "quant_prefill.c", "quant_amx.c", "quant_amx_bf16.c", "linear.c")
    sources = [str(KERNELS / n) for n in names]
    flags = ["-O2", "-std=gnu11", "-ffp-contract=fast", "-fPIC", "-shared", "-fopenmp"]
    cmd = [cc, *flags, "-Wno-psabi", *TARGETS[target], "-o", str(lib_path), *sources, "-lm"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    lib = ctypes.CDLL(str(lib_path))
    fn = lib.splitserve_linear_quant
    i64, i32, p = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
    fn.argtypes = [p, i64, p, p, p, *[i32] * 6, p, i64, i32, i32, i32, i32]
    fn.restype = None
    for bits, group, scales, mins, n, k in CASES:
        q = rows_of(bits, group, scales, mins, n, k)
        half, full = QuantWeight(q), QuantWeight(q, half_scales=False)
        for m in ROWS:
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
            got = []
            for w in (half, full):
                flag = int(w.scales.dtype == torch.float16)
                if w.mins is not None and w.mins.dtype == torch.float16:
                    flag |= 2
                mins_ptr = None if w.mins is None else w.mins.data_ptr()
                for amx_rows in (1, 0):
                    out = torch.full((m, n), 0.5)
                    fn(x.data_ptr(), k, w.codes.data_ptr(), w.scales.data_ptr(), mins_ptr, flag,
                       bits, group, m, n, k, out.data_ptr(), n, 1, 2, amx_rows, 0)  # fmt: skip
                    got.append(out)
            assert torch.equal(got[0], got[2]) and torch.equal(got[1], got[3]), (target, m)
            dense = 0.5 + x.double() @ q.dequantize().double().T
            assert torch.allclose(got[1].double(), dense, rtol=1e-4, atol=1e-4), (target, m)
