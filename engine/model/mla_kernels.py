"""The kernel that runs MLA's attention under a step's attention backend: the C kernel
(``engine.cpu_kernels.mla``) under the torch backend with its CPU kernels, the Triton one
(``engine.triton_kernels.mla_attention``) under the Triton backend, else none (the torch
path of ``engine.model.mla_attention``, the oracle both are tested against).

A kernel takes the step's absorbed queries [tokens, heads, latent] and returns each head's
attention output in the latent space [tokens, heads, kv_lora]: decodes and prefill chunks
(a cached prefix included) in one call.
"""

from __future__ import annotations

from typing import Protocol

import torch

from engine.cpu_kernels import PrefillIndex, prefill_index
from engine.cpu_kernels.mla import KERNEL, mla_supported, paged_mla_attention
from engine.model.attention import AttentionBackend, AttentionMetadata, TritonAttention
from engine.model.torch_attention import TorchAttention


class LatentKernel(Protocol):
    def __call__(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        layer: int,
        meta: AttentionMetadata,
        kv_lora: int,
        scale: float,
    ) -> torch.Tensor: ...


def latent_kernel(
    attention: AttentionBackend | None, q: torch.Tensor, kv_cache: torch.Tensor
) -> LatentKernel | None:
    """The kernel for ``attention`` and these tensors, or None (keep torch)."""
    if isinstance(attention, TritonAttention):
        return triton_latent
    if isinstance(attention, TorchAttention) and attention.cpu_kernel:
        return c_latent if mla_supported(q, kv_cache) else None
    return None


def triton_latent(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    layer: int,
    meta: AttentionMetadata,
    kv_lora: int,
    scale: float,
) -> torch.Tensor:
    from engine.triton_kernels import paged_mla_attention as triton_mla

    return triton_mla(
        q, kv_cache, layer, meta.query_start_loc, meta.context_lens, meta.block_tables,
        kv_lora, scale, max(meta.query_lens),
    )  # fmt: skip


class _StepIndex:
    """The C kernel's index of the last step, checked once and read by every layer (the
    step's metadata is kept alive with it, so ``is`` cannot match a newer step)."""

    last: tuple[AttentionMetadata, PrefillIndex] | None = None

    @classmethod
    def of(cls, meta: AttentionMetadata, block_size: int) -> PrefillIndex:
        cached = cls.last
        if cached is None or cached[0] is not meta or cached[1].block_size != block_size:
            index = prefill_index(
                meta.query_start_loc, meta.context_lens, meta.block_tables, meta.num_tokens,
                block_size, KERNEL,
            )  # fmt: skip
            cached = cls.last = (meta, index)
        return cached[1]


def c_latent(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    layer: int,
    meta: AttentionMetadata,
    kv_lora: int,
    scale: float,
) -> torch.Tensor:
    index = _StepIndex.of(meta, kv_cache.shape[3])
    return paged_mla_attention(q, kv_cache, layer, index, kv_lora, scale)
