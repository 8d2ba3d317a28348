"""Time spent in an engine's mixture-of-experts layers during a benchmark run.

Hooks around every ``SparseMoe`` of the model add up the wall time of their forwards and the
FLOPs of their active parameters (the router, and for each token its top-k experts' gate,
up and down matmuls, and the shared expert), so ``bench.offline`` can report the MoE layers'
GFLOP/s against the same run's matmul peak. CPU only: CUDA forwards return before the GPU
finishes (there the decode-step roofline of ``bench.decode_step`` is the figure).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from engine.model.moe import SparseMoe


class MoeLayerTimer:
    """Accumulated seconds and FLOPs of the model's MoE layers; ``detach`` removes the hooks."""

    def __init__(self, blocks: list[SparseMoe]) -> None:
        self.seconds = 0.0
        self.flops = 0.0
        self.calls = 0
        self._start = 0.0
        self._handles = [h for b in blocks for h in self._hook(b)]

    @classmethod
    def attach(cls, model: torch.nn.Module) -> MoeLayerTimer | None:
        blocks = [m for m in model.modules() if isinstance(m, SparseMoe)]
        on_cpu = next(model.parameters()).device.type == "cpu"
        return cls(blocks) if blocks and on_cpu else None

    def _hook(self, block: SparseMoe) -> list[Any]:
        hidden = block.gate.shape[1]
        per_token = block.num_experts + 3 * block.top_k * block.intermediate
        per_token += 3 * block.shared_intermediate + (1 if block.shared_intermediate else 0)

        def before(_: torch.nn.Module, args: tuple[Any, ...]) -> None:
            self._start = time.perf_counter()

        def after(_: torch.nn.Module, args: tuple[Any, ...], out: Any) -> None:
            self.seconds += time.perf_counter() - self._start
            self.flops += 2.0 * hidden * per_token * args[0].shape[0]
            self.calls += 1

        return [block.register_forward_pre_hook(before), block.register_forward_hook(after)]

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()

    def summary(self, run_seconds: float) -> dict[str, float]:
        return timer_summary("moe", self.seconds, self.flops, self.calls, run_seconds)


def timer_summary(
    prefix: str, seconds: float, flops: float, calls: int, run_seconds: float
) -> dict[str, float]:
    """A layer timer's figures, keyed ``{prefix}_seconds``, ``_share_of_run``,
    ``_gflop_s`` and ``_calls``."""
    return {
        f"{prefix}_seconds": seconds,
        f"{prefix}_share_of_run": seconds / run_seconds if run_seconds else 0.0,
        f"{prefix}_gflop_s": flops / seconds / 1e9 if seconds else 0.0,
        f"{prefix}_calls": calls,
    }


def describe(summary: dict[str, float], peak_gflops: float) -> str:
    return describe_timer(summary, peak_gflops, "moe", "MoE layers", "the active parameters")


def describe_timer(
    summary: dict[str, float], peak_gflops: float, prefix: str, label: str, counted: str
) -> str:
    """One line of a layer timer's summary (``timer_summary`` with ``prefix``): time, share
    of the run, calls, GFLOP/s over what ``counted`` names and the ratio to the peak."""
    rate = summary[f"{prefix}_gflop_s"]
    return (
        f"{label}: {summary[f'{prefix}_seconds']:.2f} s "
        f"({100 * summary[f'{prefix}_share_of_run']:.0f}% of the run, "
        f"{summary[f'{prefix}_calls']:.0f} calls), {rate:.1f} GFLOP/s over {counted}, "
        f"ratio to peak {rate / peak_gflops:.3f}"
    )
