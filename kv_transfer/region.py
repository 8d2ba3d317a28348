"""The registered KV tensor seen as an array of equal, contiguous blocks of bytes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


class KVRegion:
    """A block-major KV tensor: `kv[i]` is block `i`, one contiguous region.

    kv: [num_blocks, ...] (engine layout: [num_blocks, num_layers, 2, block_size, kv_heads,
    head_dim]); only dim 0 matters here, the layout is checked through its fingerprint.
    """

    def __init__(self, kv: torch.Tensor) -> None:
        if kv.dim() < 2 or kv.shape[0] < 1:
            raise ValueError(f"kv must be [num_blocks, ...] with num_blocks >= 1, got {kv.shape}")
        if not kv.is_contiguous():
            raise ValueError("kv must be contiguous so that each block is one region")
        if kv.device.type not in ("cpu", "cuda"):
            raise ValueError(f"kv must live on cpu or cuda, got {kv.device}")
        self.kv = kv
        self.num_blocks = int(kv.shape[0])
        self.block_bytes = kv[0].numel() * kv.element_size()
        self.base_address = kv.data_ptr()
        self.is_cuda = kv.device.type == "cuda"
        self.mem_type = "VRAM" if self.is_cuda else "DRAM"
        self.device_id = (kv.device.index or 0) if self.is_cuda else 0
        # bytes: [num_blocks, block_bytes] uint8 view of the same memory
        self.bytes = kv.view(-1).view(torch.uint8).view(self.num_blocks, self.block_bytes)

    def descriptors(self) -> np.ndarray:
        """[num_blocks, 3] uint64 rows (address, length, device id), one per block."""
        return block_descriptors(
            self.base_address, self.block_bytes, self.num_blocks, self.device_id
        )

    def check_ids(self, ids: Sequence[int], what: str, *, unique: bool) -> None:
        """ValueError unless every id is a block of this region (and distinct when `unique`)."""
        check_block_ids(ids, self.num_blocks, what, unique=unique)

    def host_view(self, block_id: int) -> memoryview:
        """Block bytes as a writable memoryview of the tensor itself (CPU only, no copy)."""
        if self.is_cuda:
            raise ValueError("host_view needs a CPU tensor")
        return self.bytes[block_id].numpy().data

    def read_block(self, block_id: int) -> memoryview:
        """Block bytes for sending: the tensor's own memory on CPU, a host copy on CUDA."""
        if self.is_cuda:
            return self.bytes[block_id].cpu().numpy().data
        return self.host_view(block_id)


def check_block_ids(ids: Sequence[int], num_blocks: int, what: str, *, unique: bool) -> None:
    if len(ids) == 0:
        raise ValueError(f"{what} is empty")
    lo, hi = min(ids), max(ids)
    if lo < 0 or hi >= num_blocks:
        raise ValueError(f"{what} must lie in [0, {num_blocks}), got ids from {lo} to {hi}")
    if unique and len(set(ids)) != len(ids):
        raise ValueError(f"{what} holds the same block twice")


def block_descriptors(base: int, block_bytes: int, num_blocks: int, device_id: int) -> np.ndarray:
    """[num_blocks, 3] uint64 rows (address, length, device id) of equal consecutive blocks."""
    rows = np.empty((num_blocks, 3), dtype=np.uint64)
    offsets = np.arange(num_blocks, dtype=np.uint64) * np.uint64(block_bytes)
    rows[:, 0] = np.uint64(base) + offsets
    rows[:, 1] = block_bytes
    rows[:, 2] = device_id
    return rows
