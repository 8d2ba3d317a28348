"""The batched sampler's C kernel (``sampling.c``): argmax, or a draw after temperature,
top-k, top-p and min-p, one pass per row (engine.sampling.sampler uses it on the CPU)."""

from __future__ import annotations

import torch

from engine.cpu_kernels import _require, _threads


def sample(
    logits: torch.Tensor,
    greedy: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seed: torch.Tensor,
    draws: torch.Tensor,
) -> torch.Tensor:
    """One token per row of logits [rows, vocab] fp32 (unit last stride): the first argmax
    of greedy rows, else a draw after temperature, top-k (>= vocab: off), top-p and min-p with
    the uniform number splitmix64(seed, draws) (see engine.sampling.sampler). The settings are
    [rows] tensors (bool, float32, int64, float32, float32, int64, int64). Returns [rows]
    int64."""
    lib = _require()
    rows, vocab = logits.shape
    if logits.dtype != torch.float32 or logits.stride(-1) != 1 or logits.device.type != "cpu":
        raise ValueError("sample: logits must be fp32 on the CPU with a unit last stride")
    settings = (greedy, temperature, top_k, top_p, min_p, seed, draws)
    f32, i64 = torch.float32, torch.int64
    dtypes = (torch.bool, f32, i64, f32, f32, i64, i64)
    args = []
    for t, dtype in zip(settings, dtypes, strict=True):
        if t.shape != (rows,):
            raise ValueError(f"sample: {rows} rows of logits need [{rows}] settings")
        args.append(t.to(dtype).contiguous())
    args[0] = args[0].view(torch.uint8)
    out = torch.empty(rows, dtype=torch.int64)
    if rows == 0:
        return out
    rc = lib.splitserve_sample_f32(
        logits.data_ptr(), logits.stride(0), rows, vocab, *(a.data_ptr() for a in args),
        out.data_ptr(), _threads(),
    )  # fmt: skip
    if rc != 0:
        raise MemoryError(f"sample: no scratch memory for a vocabulary of {vocab}")
    return out


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """The first argmax of each row of logits [rows, vocab] fp32 (unit last stride), in one
    pass without a copy (torch's CPU argmax is several times slower). Returns [rows] int64."""
    rows = logits.shape[0]
    greedy = torch.ones(rows, dtype=torch.bool)
    ones, zeros = torch.ones(rows), torch.zeros(rows, dtype=torch.int64)
    return sample(logits, greedy, ones, zeros, ones, ones * 0, zeros, zeros)
