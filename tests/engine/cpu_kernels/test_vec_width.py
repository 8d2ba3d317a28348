"""The kernels are built for the machine's vector width (16 floats with AVX-512, else 8), and
the linear kernel's code for each width gives F.linear's results: the other width is built
with SPLITSERVE_CPU_VEC_WIDTH and run in a child process (a narrower machine runs 16-float
vectors as register pairs), so both widths are checked on whichever machine runs the tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import cpu_kernels
from engine.cpu_kernels.build import WIDTH_ENV, KernelBuildError, build

pytestmark = pytest.mark.skipif(
    not cpu_kernels.available(), reason="the CPU kernels need a C compiler (cc or $CC)"
)

# Rows: every tail of a 6- and a 12-row tile, the chunked walk (7 to 47), one pass (48+) and
# a second 512-row block; K: whole 64-input chunks and a part. Each row's product must also
# not depend on the rows beside it (bit for bit), as speculative verification relies on.
CHECK = """
import torch, torch.nn.functional as F
from engine import cpu_kernels
assert cpu_kernels.vec_width() == {width}, cpu_kernels.vec_width()
gen = torch.Generator().manual_seed(0)
w = torch.randn(96, 150, generator=gen)
packed = cpu_kernels.pack_linear_weight(w)
x = torch.randn(601, 150, generator=gen)
alone = torch.cat([cpu_kernels.linear(x[i : i + 1], packed) for i in range(60)])
for rows in list(range(1, 26)) + [36, 47, 48, 60, 601]:
    got = cpu_kernels.linear(x[:rows], packed)
    torch.testing.assert_close(got, F.linear(x[:rows], w))
    h = torch.randn(rows, 96, generator=gen)
    added = cpu_kernels.linear(x[:rows], packed, h.clone())
    torch.testing.assert_close(added, h + x[:rows] @ w.t())
    if rows <= 60:
        assert torch.equal(got, alone[:rows]), rows
print("ok")
"""


def _has_avx512() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return False
    return " avx512f" in flags


def test_kernels_use_the_machines_width() -> None:
    assert cpu_kernels.vec_width() == (16 if _has_avx512() else 8)


@pytest.mark.parametrize("width", [8, 16])
def test_linear_at_each_width_equals_torch(width: int) -> None:
    env = dict(os.environ, **{WIDTH_ENV: str(width)})
    done = subprocess.run(
        [sys.executable, "-c", CHECK.format(width=width)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_a_bad_width_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(WIDTH_ENV, "12")
    with pytest.raises(KernelBuildError, match=f"{WIDTH_ENV}='12'.*8 or 16"):
        build(tmp_path)
