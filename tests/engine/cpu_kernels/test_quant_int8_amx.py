"""The AMX-int8 kernel of the many-row integer products (quant_int8_amx.c). Where the host has
no AMX, the kernel is built with its tile instructions done in C from their definitions
(SPLITSERVE_AMX_EMULATE=1) and run in a child process: its products equal the rounded rows
times the dequantized weights, as the VNNI kernel's do, and equal the VNNI kernel's bit for
bit (a row's result must not depend on which kernel took it); an emulated unit that miscounts
is refused by the check at first use, and the products stay right. On an AMX-INT8 host the
real kernel passes that check and is on."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from engine import cpu_kernels
from engine.cpu_kernels import quant_int8
from engine.cpu_kernels.build import AMX_EMULATE_ENV, KernelBuildError, build

pytestmark = pytest.mark.skipif(
    not cpu_kernels.available() or quant_int8.isa() == 0, reason="no integer-dot kernel here"
)

CHECK = """
import torch
from engine.cpu_kernels import quant_int8
from tests.engine.cpu_kernels.test_quant_int8 import CASES, TOLERANCE, rounded
from tests.engine.cpu_kernels.test_quant_linear import random_weight

lib = quant_int8._lib()
assert lib.splitserve_qi8_amx_built() == 2 and quant_int8.amx_int8()
gen = torch.Generator().manual_seed(0)


# linear(x) (added into a strided view of h's copy, where given) against the oracle
def check(linear, dense, x, group, h=None):
    xr = rounded(x, group)
    want, scale = xr @ dense.T, xr.abs() @ dense.abs().T
    if h is None:
        got = linear(x)
    else:
        out = h.clone()
        linear(x, out[:, 5:])
        assert torch.equal(out[:, :5], h[:, :5])
        got, want, scale = out[:, 5:], want + h[:, 5:].double(), scale + h[:, 5:].double().abs()
    assert ((got.double() - want).abs() <= TOLERANCE * scale).all(), x.shape
    return got


for bits, group, mins, n, k in CASES:
    weight = random_weight(n, k, bits, group, mins, seed=n + k + bits)
    linear, dense = quant_int8.QuantInt8Linear(weight._cpu_kernel), weight.dequantize().double()
    for threads in (1, 2):
        torch.set_num_threads(threads)
        # pairs of 16-row tiles, one tile, VNNI tails; past a row block of K = 1088
        for m in (16, 21, 32, 47, 64, 77, 300):
            x = torch.randn(m + 2, k + 8, generator=gen)[2:, 8:] * 3  # rows k + 8 apart
            h = torch.randn(m, n + 5, generator=gen)
            got = [check(linear, dense, x, group), check(linear, dense, x, group, h)]
            with quant_int8.without_amx():
                assert torch.equal(linear(x), got[0]), (bits, group, n, k, m)
                assert torch.equal(check(linear, dense, x, group, h), got[1]), (bits, n, k, m)
            assert quant_int8.kernel_name() == "amx_int8"

lib.splitserve_qi8_amx_emulate_fault(1)
quant_int8._amx_checked.cache_clear()
assert not quant_int8.amx_int8()
bits, group, mins, n, k = CASES[0]
weight = random_weight(n, k, bits, group, mins, seed=1)
linear = quant_int8.QuantInt8Linear(weight._cpu_kernel)
check(linear, weight.dequantize().double(), torch.randn(48, k, generator=gen), group)
print("ok")
"""


def test_the_emulated_amx_kernel_gives_the_vnni_kernels_sums() -> None:
    env = dict(os.environ, **{AMX_EMULATE_ENV: "1"})
    done = subprocess.run(
        [sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")
    assert "qi8_amx_refused" in done.stderr  # the faulty unit, named in the log


@pytest.mark.skipif(
    not cpu_kernels.available() or quant_int8._lib().splitserve_qi8_amx_built() != 1,
    reason="no AMX-INT8 here: the kernels were not built for AMX-TILE/AMX-INT8 (-march=native "
    "on a machine without them); the emulated test runs the kernel's logic instead",
)
def test_on_an_amx_int8_host_the_kernel_passes_its_check() -> None:
    assert quant_int8.amx_int8()


def test_an_unknown_emulation_setting_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(AMX_EMULATE_ENV, "yes")
    with pytest.raises(KernelBuildError, match=f"{AMX_EMULATE_ENV}='yes'.*must be 1"):
        build()
