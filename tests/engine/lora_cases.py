"""Shared cases for the multi-LoRA delta tests (torch, C and Triton paths): stacked slots,
a per-token slot index mixing adapters and the base model, and a per-token reference."""

from __future__ import annotations

from typing import NamedTuple

import torch

# fused matrix shapes: (sub-matrix column ends, in features); q/k/v-like, gate/up-like, single
LAYOUTS = {
    "qkv": ((40, 56, 72), 48),
    "gate_up": ((64, 128), 48),
    "down": ((48,), 64),
}
# per-token slots: decodes of several adapters, base rows (-1), one prefill chunk
SLOT_CASES = {
    "mixed": [0, -1, 2, 1, 1, 1, 1, -1, 2, 0, 0, 0],
    "one_adapter": [1] * 7,
    "all_base": [-1, -1, -1],
    "single_token": [2],
}
NUM_SLOTS, RANK = 3, 8


class DeltaCase(NamedTuple):
    x: torch.Tensor  # [T, in]
    a: torch.Tensor  # [slots, subs * rank, in]
    b: torch.Tensor  # [slots, out, rank]
    token_slots: torch.Tensor  # [T] int64
    ends: tuple[int, ...]
    out: torch.Tensor  # [T, out], the base projection's output


def make_case(
    layout: str, slots: list[int], dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> DeltaCase:
    ends, features = LAYOUTS[layout]
    g = torch.Generator().manual_seed(len(slots) * 7 + len(ends))
    subs, tokens = len(ends), len(slots)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    return DeltaCase(
        rand(tokens, features),
        rand(NUM_SLOTS, subs * RANK, features) / features**0.5,
        rand(NUM_SLOTS, ends[-1], RANK),
        torch.tensor(slots, dtype=torch.int64, device=device),
        ends,
        rand(tokens, ends[-1]),
    )


def reference(case: DeltaCase) -> torch.Tensor:
    """out + delta, token by token in fp64: out[t, sub i] += B_i[s] @ (A_i[s] @ x[t])."""
    want = case.out.double().clone()
    starts = (0, *case.ends[:-1])
    for t, slot in enumerate(case.token_slots.tolist()):
        if slot < 0:
            continue
        for i, (lo, hi) in enumerate(zip(starts, case.ends, strict=True)):
            a = case.a[slot, i * RANK : (i + 1) * RANK].double()  # [rank, in]
            b = case.b[slot, lo:hi].double()  # [hi - lo, rank]
            want[t, lo:hi] += b @ (a @ case.x[t].double())
    return want
