"""A random step over a latent (MLA) cache for the kernel tests: decodes, a fresh prompt and a
chunk after a cached prefix, their rows written into a cache of any ``kv_cache_dtype``, and
the torch path's output (the oracle) beside the one a backend's kernel gives."""

from __future__ import annotations

from typing import NamedTuple

import torch

from engine.kv_format.rows import CODE_DTYPES, read_plane, row_width, write_plane
from engine.model.attention import AttentionBackend, AttentionMetadata
from engine.model.mla_attention import Absorbed, LatentQuery, latent_attention

# (query tokens, first position): two decodes, a fresh prompt, a chunk after 9 cached tokens
SEQUENCES = ((1, 6), (1, 12), (6, 0), (5, 9))
LAYERS, BLOCKS = 2, 40


class MlaShape(NamedTuple):
    heads: int
    kv_lora: int
    rope: int
    nope: int
    v_dim: int
    block_size: int

    @property
    def latent(self) -> int:
        return self.kv_lora + self.rope


# the tiny test models' (a block of 4), wider than a vector, more heads than a C unit's rows
SHAPES = {
    "tiny": MlaShape(4, 32, 8, 16, 12, 4),
    "wide": MlaShape(6, 64, 16, 24, 16, 16),
    "many-heads": MlaShape(40, 24, 8, 8, 8, 8),
}


class MlaStep(NamedTuple):
    query: LatentQuery
    weights: Absorbed
    kv_cache: torch.Tensor
    meta: AttentionMetadata
    scale: float

    def run(self, attention: AttentionBackend | None, layer: int = 1) -> torch.Tensor:
        """[tokens, heads, v_dim] of layer ``layer`` under ``attention`` (None: torch)."""
        q, w, kv, meta = self.query, self.weights, self.kv_cache, self.meta
        return latent_attention(q, w, kv, layer, meta, self.scale, attention)


def mla_step(
    shape: MlaShape, kv_dtype: str = "auto", seed: int = 0, device: str | torch.device = "cpu"
) -> MlaStep:
    """A step of ``SEQUENCES`` whose every context row is in layer 1 of a fresh cache (layer 0
    holds other rows: a kernel reading the wrong layer shows), on ``device``."""
    gen = torch.Generator().manual_seed(seed)
    bs, latent = shape.block_size, shape.latent
    width = row_width(latent, kv_dtype)
    dtype = CODE_DTYPES.get(kv_dtype, torch.float32)
    kv = torch.zeros(BLOCKS, LAYERS, 1, bs, 1, width, dtype=dtype)
    order = torch.randperm(BLOCKS, generator=gen).tolist()
    tables, used = [], 0
    for n, start in SEQUENCES:
        blocks = -(-(start + n) // bs)
        tables.append(order[used : used + blocks])
        used += blocks
    meta = AttentionMetadata.build([n for n, _ in SEQUENCES], [s for _, s in SEQUENCES], tables, bs)
    for layer in range(LAYERS):  # every context row of every sequence, this step's included
        for (n, start), table in zip(SEQUENCES, tables, strict=True):
            pos = torch.arange(start + n)
            slots = torch.tensor(table)[pos // bs] * bs + pos % bs
            write_plane(kv, layer, 0, torch.randn(start + n, 1, latent, generator=gen), slots)
    # this step's rows as the cache holds them (dequantized): the torch oracle reads them
    step_rows = read_plane(kv, 1, 0, meta.slot_mapping // bs).float()
    rows = step_rows[torch.arange(meta.num_tokens), meta.slot_mapping % bs]  # [tokens, 1, L]
    tokens, h = meta.num_tokens, shape.heads
    query = LatentQuery(
        torch.randn(tokens, h, shape.nope, generator=gen),
        torch.randn(tokens, h, shape.rope, generator=gen),
        rows,
    )
    kv_b = torch.randn(h * (shape.nope + shape.v_dim), shape.kv_lora, generator=gen) * 0.3
    weights = Absorbed.split(kv_b.to(device), h, shape.nope)
    query = LatentQuery(*(t.to(device) for t in query))
    meta = AttentionMetadata.build(
        [n for n, _ in SEQUENCES], [s for _, s in SEQUENCES], tables, bs, device
    )
    return MlaStep(query, weights, kv.to(device), meta, (shape.nope + shape.rope) ** -0.5)
