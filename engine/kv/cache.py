"""The paged KV cache: one block-major tensor per node and its layout (sizing:
engine.kv.sizing).

Layout: ``[num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]``. One block of all
layers (K and V) is one contiguous region, so moving a block between nodes is one descriptor.
Token ``t`` of a request lives at slot ``block_table[t // block_size] * block_size +
t % block_size``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from engine.config import parse_dtype
from engine.model.config import ModelConfig

LAYOUT_ORDER = "block-major"  # [blocks, layers, 2, block_size, kv_heads, head_dim]


@dataclass(frozen=True)
class KVLayout:
    """Everything two nodes must agree on before they exchange KV blocks."""

    model: str
    dtype: str  # torch dtype name, e.g. "float32"
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    layer_windows: tuple[int, ...] = ()  # per layer, 0: full attention; () : all full

    def __post_init__(self) -> None:
        parse_dtype(self.dtype)  # ValueError for an unsupported dtype
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise ValueError(
                f"KVLayout.layer_windows has {len(self.layer_windows)} entries for "
                f"{self.num_layers} layers"
            )
        for field in ("block_size", "num_layers", "num_kv_heads", "head_dim"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"KVLayout.{field} must be an integer >= 1, got {value!r}")

    @classmethod
    def for_model(cls, model: ModelConfig, dtype: torch.dtype | str, block_size: int) -> KVLayout:
        return cls(
            model=model.name,
            dtype=_dtype_name(parse_dtype(dtype)),
            block_size=block_size,
            num_layers=model.num_hidden_layers,
            num_kv_heads=model.num_key_value_heads,
            head_dim=model.head_dim,
            layer_windows=model.layer_windows if any(model.layer_windows) else (),
        )

    @property
    def torch_dtype(self) -> torch.dtype:
        return parse_dtype(self.dtype)

    @property
    def block_shape(self) -> tuple[int, int, int, int, int]:
        """Shape of one block: ``[num_layers, 2, block_size, num_kv_heads, head_dim]``."""
        return (self.num_layers, 2, self.block_size, self.num_kv_heads, self.head_dim)

    @property
    def block_bytes(self) -> int:
        elements = self.num_layers * 2 * self.block_size * self.num_kv_heads * self.head_dim
        return elements * self.torch_dtype.itemsize

    def cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        return (num_blocks, *self.block_shape)

    def fingerprint(self) -> str:
        """Short stable hash of the canonical fields; equal fingerprints mean compatible caches."""
        canonical = "|".join(
            [
                LAYOUT_ORDER,
                self.model,
                self.dtype,
                str(self.block_size),
                str(self.num_layers),
                str(self.num_kv_heads),
                str(self.head_dim),
            ]
            # windows only where some layer has one: full-attention layouts keep their hash
            + ([self.windows_text()] if self.layer_windows else [])
        )
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def windows_text(self) -> str:
        """Per-layer windows, run-length coded: ``full``, or e.g. ``7*1,0*1,7*1``."""
        if not any(self.layer_windows):
            return "full"
        runs: list[list[int]] = []
        for window in self.layer_windows:
            if runs and runs[-1][0] == window:
                runs[-1][1] += 1
            else:
                runs.append([window, 1])
        return ",".join(f"{w}*{n}" for w, n in runs)

    def describe(self) -> str:
        """One readable line, for logs and mismatch errors."""
        return (
            f"model={self.model} dtype={self.dtype} block_size={self.block_size} "
            f"layers={self.num_layers} kv_heads={self.num_kv_heads} head_dim={self.head_dim} "
            f"windows={self.windows_text()} ({LAYOUT_ORDER}, {self.block_bytes} bytes/block, "
            f"fingerprint {self.fingerprint()})"
        )


def allocate_kv_cache(
    layout: KVLayout, num_blocks: int, device: torch.device | str
) -> torch.Tensor:
    """The zeroed cache ``[num_blocks, num_layers, 2, block_size, kv_heads, head_dim]``.

    Zeroed, not empty: masked-out slots are still read by the attention and must be finite.
    """
    return torch.zeros(layout.cache_shape(num_blocks), dtype=layout.torch_dtype, device=device)


def write_kv(
    kv: torch.Tensor, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store new keys and values of ``layer`` at their slots.

    k, v: [tokens, kv_heads, head_dim]; slot_mapping: [tokens] int64.
    """
    block_size = kv.shape[3]
    blocks = slot_mapping // block_size  # [tokens]
    offsets = slot_mapping % block_size  # [tokens]
    kv[:, layer, 0].index_put_((blocks, offsets), k)
    kv[:, layer, 1].index_put_((blocks, offsets), v)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
