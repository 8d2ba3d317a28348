"""The LoRA delta of a fused projection for a step whose tokens run under different adapters.

Every token carries the device slot of its request's adapter (``LoraBatch.token_slots``,
negative: the base model). The delta is a shrink (``y = A[slot] x``, [tokens, subs * rank])
then an expand (``out[:, cols of sub i] += B[slot] y_i``), added to the base projection's
output in place. Three paths, chosen once per engine: the C kernels on the CPU, Triton on
CUDA, and torch (grouped by slot: the reference the others are tested against).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.cpu_kernels import lora as cpu_lora
from engine.lora.slots import MatrixSlots

KERNELS = ("torch", "cpu", "triton")


@dataclass(frozen=True)
class LoraBatch:
    """A step's adapter index, built once and read by every layer."""

    token_slots: torch.Tensor  # [tokens] int64 on the device; negative: no adapter
    slots: tuple[int, ...]  # the distinct slots of the step's tokens, ascending
    plan: cpu_lora.CpuPlan | None = None  # the tokens grouped by slot, for the C kernel
    # run every matrix's kernels whatever the slots hold now: a CUDA graph's batch, captured
    # before the adapters it will serve are loaded (engine.step.graphs)
    every_matrix: bool = False

    def uses(self, matrix: MatrixSlots) -> bool:
        """Some adapter of the step has weights for this matrix."""
        return self.every_matrix or any(matrix.targeted[s] for s in self.slots)


def torch_shrink(
    x: torch.Tensor, a: torch.Tensor, token_slots: torch.Tensor, slots: Sequence[int]
) -> torch.Tensor:
    """y [T, rows] fp32: y[t] = a[token_slots[t]] @ x[t]; zeros for tokens without a slot."""
    y = torch.zeros(x.shape[0], a.shape[1], dtype=torch.float32, device=x.device)
    for slot in slots:
        rows = (token_slots == slot).nonzero().squeeze(1)  # [n]
        y[rows] = (x[rows].float() @ a[slot].float().T).to(y.dtype)
    return y


def torch_expand_add_(
    out: torch.Tensor,
    y: torch.Tensor,
    b: torch.Tensor,
    token_slots: torch.Tensor,
    ends: Sequence[int],
    slots: Sequence[int],
) -> None:
    """out[t, cols of sub i] += b[slot, those cols] @ y[t, i * R : (i + 1) * R], in place."""
    rank = b.shape[2]
    for slot in slots:
        rows = (token_slots == slot).nonzero().squeeze(1)  # [n]
        delta = torch.cat(
            [
                y[rows, i * rank : (i + 1) * rank] @ b[slot, lo:hi].float().T  # [n, hi - lo]
                for i, (lo, hi) in enumerate(zip((0, *ends[:-1]), ends, strict=True))
            ],
            dim=1,
        )
        out.index_add_(0, rows, delta.to(out.dtype))


def choose_kernel(device: torch.device, dtype: torch.dtype, cpu_kernels_on: bool) -> str:
    """Triton on CUDA, C on the CPU in fp32 where the kernels are built, else torch."""
    if device.type == "cuda":
        return "triton"
    if dtype == torch.float32 and cpu_kernels_on:
        from engine import cpu_kernels

        if cpu_kernels.available():
            return "cpu"
    return "torch"


def add_delta_(
    out: torch.Tensor, x: torch.Tensor, matrix: MatrixSlots, batch: LoraBatch, kernel: str
) -> None:
    """out [T, N] += the step's LoRA delta of `matrix` for x [T, in], in place."""
    if kernel == "cpu":
        cpu, plan = matrix.cpu, batch.plan
        if cpu is not None and plan is not None and cpu_lora.supports(x, out):
            cpu_lora.add_(out, x, cpu, plan)
            return
    ends, slots = matrix.layout.ends, batch.token_slots
    if kernel == "triton":
        from engine.triton_kernels.lora import lora_expand_add_, lora_shrink

        x = x if x.stride(-1) == 1 else x.contiguous()
        lora_expand_add_(out, lora_shrink(x, matrix.a, slots), matrix.b, slots, ends)
        return
    y = torch_shrink(x, matrix.a, slots, batch.slots)
    torch_expand_add_(out, y, matrix.b, slots, ends, batch.slots)


class PackedLora:
    """The hook a ``Packed`` layer object consults after each projection: adds the step's
    delta of the named fused matrix (nothing when no row of the step has an adapter)."""

    def __init__(self, matrices: dict[str, MatrixSlots], step: StepLora) -> None:
        self.matrices = matrices
        self.step = step

    def add_(self, out: torch.Tensor, x: torch.Tensor, name: str) -> None:
        batch = self.step.batch
        matrix = self.matrices.get(name)
        if batch is None or matrix is None or not batch.uses(matrix):
            return
        add_delta_(out, x, matrix, batch, self.step.kernel)


class StepLora:
    """What every layer's hook reads: the current step's batch and the kernel path."""

    def __init__(self, kernel: str) -> None:
        if kernel not in KERNELS:
            raise ValueError(f"LoRA kernel must be one of {KERNELS}, got {kernel!r}")
        self.kernel = kernel
        self.batch: LoraBatch | None = None
