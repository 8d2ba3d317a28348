"""The kernels are built for the machine's vector width (16 floats with AVX-512, else 8), and
the linear kernel's code for each width gives F.linear's results: the other width is built
with SPLITSERVE_CPU_VEC_WIDTH and run in a child process (a narrower machine runs 16-float
vectors as register pairs), so both widths are checked on whichever machine runs the tests.

An int8 KV cache's path (the rotated, quantized row write, and the prefill and decode
attention reading those rows) gives the same bits at both widths: what int8 KV keeps of
float32's greedy answers does not depend on the width through it (bench.kv_greedy)."""

from __future__ import annotations

import os
import platform
import re
import shutil
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


# int8 rows written by the RoPE kernel, then read by prefill attention (a fresh prompt, and a
# chunk after a cached prefix of 50 tokens) and by decode attention; a digest of every output
INT8_ROWS = """
import hashlib, torch
from engine import cpu_kernels
assert cpu_kernels.vec_width() == {width}, cpu_kernels.vec_width()
gen = torch.Generator().manual_seed(0)
heads, kv_heads, d, tokens = 9, 3, 64, 70
qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, generator=gen) * 3
qkv += torch.randn((heads + 2 * kv_heads) * d, generator=gen)  # per-channel offsets
cos, sin = torch.randn(128, d // 2, generator=gen), torch.randn(128, d // 2, generator=gen)
kv = torch.zeros(8, 2, 2, 16, kv_heads, d + 8, dtype=torch.int8)
table, positions = torch.tensor([[5, 2, 7, 0, 3]], dtype=torch.int32), torch.arange(tokens)
slots = table[0].long()[positions // 16] * 16 + positions % 16
cpu_kernels.rope_write_kv(qkv, heads, kv_heads, positions, cos, sin, kv, 1, slots)
q, k, v = qkv.view(tokens, -1, d).split([heads, kv_heads, kv_heads], dim=1)
q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
prefill = cpu_kernels.paged_prefill_attention
lens = torch.tensor([tokens])
outs = [kv, qkv, prefill(q, k, v, kv, 1, torch.tensor([0, tokens]), lens, table, 0.125)]
outs.append(prefill(q[50:], k[50:], v[50:], kv, 1, torch.tensor([0, 20]), lens, table, 0.125))
decode = cpu_kernels.paged_decode_attention
outs.append(decode(q[-4:], kv, 1, table.expand(4, -1), torch.arange(67, 71), 0.125))
digest = hashlib.sha256()
for t in outs:
    digest.update(t.contiguous().view(torch.uint8).numpy().tobytes())
print(digest.hexdigest())
"""


def _child(script: str, width: int) -> str:
    """stdout of ``script`` run with the kernels built for ``width``."""
    env = dict(os.environ, **{WIDTH_ENV: str(width)})
    done = subprocess.run(
        [sys.executable, "-c", script.format(width=width)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def _has_avx512() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return False
    return " avx512f" in flags


def test_kernels_use_the_machines_width_unless_told() -> None:
    """The host's width, or the one SPLITSERVE_CPU_VEC_WIDTH asks for (the suite runs at 8 too)."""
    told = os.environ.get(WIDTH_ENV)
    assert cpu_kernels.vec_width() == (int(told) if told else 16 if _has_avx512() else 8)


@pytest.mark.parametrize("width", [8, 16])
def test_linear_at_each_width_equals_torch(width: int) -> None:
    assert _child(CHECK, width) == "ok"


def test_int8_kv_rows_give_the_same_bits_at_both_widths() -> None:
    assert _child(INT8_ROWS, 8) == _child(INT8_ROWS, 16)


def test_a_bad_width_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(WIDTH_ENV, "12")
    with pytest.raises(KernelBuildError, match=f"{WIDTH_ENV}='12'.*8 or 16"):
        build(tmp_path)


# an AVX-512 instruction in AT&T syntax: a zmm or mask register, or ymm16-31 (EVEX only)
AVX512_OPERAND = re.compile(r"%zmm|%k[0-7]\b|%ymm(1[6-9]|2\d|3[01])\b|%xmm(1[6-9]|2\d|3[01])\b")


@pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64") or not shutil.which("objdump"),
    reason="x86 only, and needs objdump",
)
def test_the_8_lane_build_runs_on_an_avx2_host(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Built for 8 lanes on any x86 host, the library holds no AVX-512 instruction: what the
    suite checks at 8 lanes is the code an AVX2-only machine builds and runs."""
    monkeypatch.setenv(WIDTH_ENV, "8")
    lib = build(tmp_path)
    listing = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", str(lib)], capture_output=True, text=True,
        check=True, timeout=300,
    ).stdout  # fmt: skip
    found = [line for line in listing.splitlines() if AVX512_OPERAND.search(line)]
    assert found == [], found[:5]
