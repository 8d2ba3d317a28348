"""bench.prefill_attention: its FLOP count, its limit's size, and its answer without CUDA."""

from __future__ import annotations

import pytest
import torch

from bench.prefill_attention import attended_pairs, equal_flops_side, main, measure, parse_args


@pytest.mark.parametrize(("new", "prefix", "window"), [(5, 0, 0), (7, 4, 0), (9, 3, 4), (3, 0, 10)])
def test_attended_pairs_counts_the_mask(new: int, prefix: int, window: int) -> None:
    q_pos = torch.arange(prefix, prefix + new)[:, None]
    keys = torch.arange(prefix + new)[None, :]
    seen = keys <= q_pos
    if window:
        seen &= keys > q_pos - window
    assert attended_pairs(new, prefix, window) == int(seen.sum())


def test_equal_flops_matmul_is_a_multiple_of_128_near_the_flops() -> None:
    n = equal_flops_side(2 * 2048**3)
    assert n == 2048
    flops = 4 * 9 * 64 * 4 * attended_pairs(2048, 0, 0)  # the default case
    n = equal_flops_side(flops)
    assert n % 128 == 0 and abs(2 * n**3 - flops) / flops < 0.2


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU this is the real benchmark")
def test_without_cuda_it_says_so_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert "no CUDA" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU this is the real benchmark")
def test_measure_runs_a_tiny_case_under_the_interpreter() -> None:
    """The code path of the GPU run, on CPU tensors (figures meaningless, errors not)."""
    pytest.importorskip("triton")
    argv = ["--seqs", "2", "--new", "9", "--prefix", "5", "--window", "6", "--heads", "4"]
    argv += ["--kv-heads", "2", "--head-dim", "16", "--block-size", "4", "--dtype", "float16"]
    figures = measure(parse_args(argv), torch.device("cpu"))
    assert figures["flops"] == 4 * 4 * 16 * 2 * attended_pairs(9, 5, 6)
    assert figures["max_abs_err_vs_reference"] < 2e-3
    assert figures["ratio"] > 0 and figures["matmul_side"] == 128
