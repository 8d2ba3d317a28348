"""The paged KV cache: one block-major tensor per rank (its stage's layers, its share of the
KV heads) and its layout (sizing: engine.kv.sizing).

Layout: ``[num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]``. One block of all
layers (K and V) is one contiguous region, so moving a block between nodes is one descriptor.
A quantized cache (``kv_cache_dtype`` int8 / fp8_e4m3, engine.kv_format.rows) has one-byte codes
and a last dim of ``head_dim + 8``: each (token, KV head) row ends with its bf16 scales and mids.
MLA models (DeepSeek) store a latent instead (``latent=True``): one plane, one "head" of
``kv_lora_rank + qk_rope_head_dim`` values a token, ``[num_blocks, num_layers, 1, block_size,
1, latent_dim]``; every tensor-parallel rank holds all of it.
Token ``t`` of a request lives at slot ``block_table[t // block_size] * block_size +
t % block_size`` (written by ``engine.kv_format.rows.write_kv`` or a kernel).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.config import parse_dtype
from engine.kv_format.dtypes import check_kv_cache_dtype
from engine.kv_format.rows import CODE_DTYPES, ROW_FORMAT, convert_rows, row_width
from engine.model.config import ModelConfig

LAYOUT_ORDER = "block-major"  # [blocks, layers, 2, block_size, kv_heads, head_dim]
LATENT_FORMAT = "mla-latent[c|k_pe]"  # one plane: the normed latent, then the rotary key


@dataclass(frozen=True)
class KVLayout:
    """Everything two nodes must agree on before they exchange KV blocks."""

    model: str
    dtype: str  # the model's torch dtype name, e.g. "float32"
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    layer_windows: tuple[int, ...] = ()  # per layer, 0: full attention; () : all full
    kv_dtype: str = "auto"  # auto (the model dtype) | int8 | fp8_e4m3 (codes + scales)
    latent: bool = False  # MLA: one plane of latent rows (num_kv_heads 1), not K and V
    # hybrid models (Qwen3-Next): the per-request state of the linear-attention layers that
    # travels with the blocks (LinearAttnSpec.describe); "": none
    state: str = ""

    def __post_init__(self) -> None:
        parse_dtype(self.dtype)  # ValueError for an unsupported dtype
        check_kv_cache_dtype(self.kv_dtype, "KVLayout.kv_dtype")
        if self.kv_dtype != "auto" and self.head_dim % 4:
            raise ValueError(
                f"kv_cache_dtype {self.kv_dtype} needs head_dim divisible by 4, got {self.head_dim}"
            )
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise ValueError(
                f"KVLayout.layer_windows has {len(self.layer_windows)} entries for "
                f"{self.num_layers} layers"
            )
        for field in ("block_size", "num_layers", "num_kv_heads", "head_dim"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"KVLayout.{field} must be an integer >= 1, got {value!r}")
        if self.latent and self.num_kv_heads != 1:
            raise ValueError(f"a latent KVLayout has one KV head, got {self.num_kv_heads}")

    @classmethod
    def for_model(
        cls,
        model: ModelConfig,
        dtype: torch.dtype | str,
        block_size: int,
        kv_dtype: str = "auto",
    ) -> KVLayout:
        kv_layers = model.kv_layers  # a hybrid model's attention layers only
        windows = tuple(model.layer_windows[i] for i in kv_layers)
        return cls(
            model=model.name,
            dtype=_dtype_name(parse_dtype(dtype)),
            block_size=block_size,
            num_layers=len(kv_layers),
            num_kv_heads=model.num_key_value_heads,
            head_dim=model.head_dim,
            layer_windows=windows if any(windows) else (),
            kv_dtype=kv_dtype,
            latent=model.mla is not None,
            state=model.linear.describe() if model.linear is not None else "",
        )

    def with_kv_dtype(self, kv_dtype: str) -> KVLayout:
        """The same layout with another ``kv_cache_dtype``."""
        return dataclasses.replace(self, kv_dtype=kv_dtype)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The cache tensor's element type: the model dtype, or the one-byte code type."""
        if self.kv_dtype == "auto":
            return parse_dtype(self.dtype)
        return CODE_DTYPES[self.kv_dtype]

    @property
    def model_dtype(self) -> torch.dtype:
        return parse_dtype(self.dtype)

    @property
    def planes(self) -> int:
        """2 (K and V), or 1 (MLA's latent)."""
        return 1 if self.latent else 2

    @property
    def block_shape(self) -> tuple[int, int, int, int, int]:
        """Shape of one block: ``[num_layers, planes, block_size, num_kv_heads, row]``; row
        is head_dim, or head_dim + 8 (codes, scales and mids) in a quantized cache."""
        row = row_width(self.head_dim, self.kv_dtype)
        return (self.num_layers, self.planes, self.block_size, self.num_kv_heads, row)

    @property
    def bytes_per_token(self) -> int:
        """KV bytes a token takes over all layers (one rank's share)."""
        return self.block_bytes // self.block_size

    @property
    def block_bytes(self) -> int:
        return math.prod(self.block_shape) * self.torch_dtype.itemsize

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
            # the KV dtype and its row format only where it is not the model's: auto layouts
            # keep their hash, and a cache of another row format is never read as this one
            + ([f"kv={self.kv_dtype}+{ROW_FORMAT}"] if self.kv_dtype != "auto" else [])
            # MLA's latent rows: never read as K / V of one head of the same width
            + ([LATENT_FORMAT] if self.latent else [])
            # a hybrid model's per-request state: its shape is part of what moves
            + ([self.state] if self.state else [])
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
        heads = (
            f"latent={self.head_dim}"
            if self.latent
            else f"kv_heads={self.num_kv_heads} head_dim={self.head_dim}"
        )
        state = f" state={self.state}" if self.state else ""
        return (
            f"model={self.model} dtype={self.dtype} kv_dtype={self.kv_dtype} "
            f"block_size={self.block_size} layers={self.num_layers} {heads} "
            f"windows={self.windows_text()}{state} ({LAYOUT_ORDER}, "
            f"{self.block_bytes} bytes/block, "
            f"fingerprint {self.fingerprint()})"
        )


def allocate_kv_cache(
    layout: KVLayout, num_blocks: int, device: torch.device | str
) -> torch.Tensor:
    """The zeroed cache ``[num_blocks, num_layers, 2, block_size, kv_heads, head_dim]``.

    Zeroed, not empty: masked-out slots are still read by the attention and must be finite.
    """
    return torch.zeros(layout.cache_shape(num_blocks), dtype=layout.torch_dtype, device=device)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def copy_converted(
    src: torch.Tensor,
    src_layout: KVLayout,
    dst: torch.Tensor,
    dst_layout: KVLayout,
    src_ids: Sequence[int],
    dst_ids: Sequence[int],
) -> None:
    """Copy blocks ``src_ids`` of ``src`` into ``dst_ids`` of ``dst`` (pairwise), each in its
    cache's ``kv_cache_dtype`` (dequantised / quantised on the way). The layouts may differ
    in the KV dtype only; ValueError naming both otherwise."""
    if src_layout.with_kv_dtype(dst_layout.kv_dtype) != dst_layout:
        raise ValueError(
            f"KV layouts differ beyond the KV dtype: {src_layout.describe()} against "
            f"{dst_layout.describe()}"
        )
    if len(src_ids) != len(dst_ids):
        raise ValueError(f"{len(src_ids)} source blocks for {len(dst_ids)} destination blocks")
    if not src_ids:
        return
    index = torch.tensor(list(src_ids), dtype=torch.int64, device=src.device)
    rows = convert_rows(  # [n, layers, 2, block_size, kv_heads, row]
        src.index_select(0, index), src_layout.kv_dtype, dst_layout.kv_dtype, dst_layout.model_dtype
    )
    dst[torch.tensor(list(dst_ids), dtype=torch.int64, device=dst.device)] = rows.to(dst.device)
