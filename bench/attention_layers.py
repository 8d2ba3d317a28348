"""Time spent in an engine's attention blocks during a benchmark run.

Every decoder layer's ``attend`` (the q/k/v projections, norms and rotary, the cache write
and the attention over the cache; the output projection is the layer's) is wrapped to add
up its wall time and FLOPs: the projections' weights, and the score and value products of
each query token with the keys it sees (its window's, on a windowed layer). Latent attention
(MLA) is counted as its absorbed form reads the cache: scores over the latent and the rotary
key, values over the latent. ``bench.offline`` reports the GFLOP/s against the same run's
matmul peak. CPU only, as ``bench.moe_layers``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from bench.moe_layers import describe_timer, timer_summary
from engine.model.attention import AttentionMetadata


class AttentionLayerTimer:
    """Accumulated seconds and FLOPs of the model's attention blocks; ``detach`` restores
    the layers' own ``attend``."""

    def __init__(self, blocks: list[Any]) -> None:
        self.seconds = 0.0
        self.flops = 0.0
        self.calls = 0
        self._blocks = blocks
        for block in blocks:
            block.attend = self._timed(block)

    @classmethod
    def attach(cls, model: torch.nn.Module) -> AttentionLayerTimer | None:
        blocks = [layer.attn for layer in getattr(model, "layers", [])]
        on_cpu = next(model.parameters()).device.type == "cpu"
        return cls(blocks) if blocks and on_cpu else None

    def _timed(self, block: Any) -> Callable[..., torch.Tensor]:
        attend = block.attend
        weights = sum(p.numel() for n, p in block.named_parameters() if p.dim() == 2)
        weights -= block.o_proj.numel()
        per_key = _per_key_flops(block)
        window = getattr(getattr(block, "spec", None), "window", 0)

        def timed(x: torch.Tensor, ops: Any, kv_cache: Any, meta: Any, attention: Any) -> Any:
            start = time.perf_counter()
            out = attend(x, ops, kv_cache, meta, attention)
            self.seconds += time.perf_counter() - start
            self.flops += 2.0 * weights * x.shape[0] + per_key * _keys_seen(meta, window)
            self.calls += 1
            return out

        return timed

    def detach(self) -> None:
        for block in self._blocks:
            del block.attend  # the class's method again

    def summary(self, run_seconds: float) -> dict[str, float]:
        return timer_summary("attention", self.seconds, self.flops, self.calls, run_seconds)


def _per_key_flops(block: Any) -> float:
    """FLOPs of one query token with one key: its scores and its values, every head."""
    mla = getattr(block, "mla", None)
    if mla is not None:
        return 2.0 * block.num_heads * (mla.latent_dim + mla.kv_lora_rank)
    return 2.0 * block.num_heads * 2 * (block.q_size // block.num_heads)


def _keys_seen(meta: AttentionMetadata, window: int) -> int:
    """The (query token, key) pairs of a step: causal, cut to ``window`` when set."""
    total = 0
    for q_len, ctx in zip(meta.query_lens, meta.context_lens_host, strict=True):
        for pos in range(ctx - q_len, ctx):
            total += min(pos + 1, window) if window else pos + 1
    return total


def describe(summary: dict[str, float], peak_gflops: float) -> str:
    return describe_timer(
        summary, peak_gflops, "attention", "attention",
        "the projections and the products with the keys seen",
    )  # fmt: skip
