"""A request's linear-attention state as it travels in KV blocks: one record per KV head.

The whole model's state of a request is one byte stream, the same whatever the
tensor-parallel size: key-head group by key-head group, each group's every linear layer
(its conv channels q, k, v, then its value heads' recurrent matrices). A rank of ``TP``
holds the groups of its key heads, a contiguous share of the stream (``StateShare``).

The record takes the last blocks of the request's table. Each KV head's cells of those
blocks (every layer, K and V, every token: the cells the transfer plan moves between pools
of any tensor-parallel sizes, engine ``kv_transfer.head_plan``) hold one unit: a header
(magic, which bytes of the stream, their crc32, the request's and the shape's crc32), then
those bytes. A rank splits its share over the KV heads it holds, so whatever rank of the
other pool holds a head receives that head's bytes. A rank reading a record takes its share
from its heads' units, and refuses the record when a unit is foreign, corrupt, or its units
do not cover its share. Where ranks replicate a KV head, each holds part of that head's
key heads: they gather their shares and every replica writes the whole unit
(``engine.kv.linear_state.whole_unit``).
"""

from __future__ import annotations

import itertools
import struct
import zlib
from dataclasses import dataclass
from typing import NamedTuple

import torch

# a unit: magic, first byte of the stream, bytes, crc32 of them, of the request id, of the
# state's shape; then the bytes
UNIT = struct.Struct("<8sQQIII")
MAGIC = b"SSGDN002"
HEADER_BYTES = 64


@dataclass(frozen=True)
class StateShare:
    """One rank's part of a request's state stream and of the record's units."""

    total: int  # bytes of the whole model's state (one request)
    start: int  # this rank's first byte in the stream
    length: int  # this rank's bytes
    unit_start: int  # the first KV head (record unit) this rank holds
    units: int  # KV heads this rank holds
    num_units: int  # the model's KV heads

    def record_blocks(self, cell_bytes: int) -> int:
        """Blocks of the record (the same on every rank and pool): a unit's header and its
        share of the stream in each KV head's cells (``cell_bytes`` per block)."""
        return -(-(HEADER_BYTES + -(-self.total // self.num_units)) // cell_bytes)


class Unit(NamedTuple):
    start: int
    data: torch.Tensor  # uint8


def write_record(
    share: StateShare, data: torch.Tensor, ids: tuple[int, int], kv_cache: torch.Tensor,
    blocks: list[int],
) -> bool:  # fmt: skip
    """Write this rank's ``data`` (uint8 [share.length]) as its units into ``blocks``;
    ``ids``: the request's and the shape's crc32. False (nothing written) when a unit does
    not fit (KV heads split unevenly over the ranks)."""
    index = torch.tensor(blocks, device=kv_cache.device)
    cells = _cells(kv_cache.index_select(0, index))  # [units, capacity]
    cells.zero_()
    for i in range(share.units):
        lo = i * share.length // share.units
        hi = (i + 1) * share.length // share.units
        if HEADER_BYTES + hi - lo > cells.shape[1]:
            return False
        part = data[lo:hi]
        head = UNIT.pack(MAGIC, share.start + lo, hi - lo, _crc(part), *ids)
        cells[i, : len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
        cells[i, HEADER_BYTES : HEADER_BYTES + hi - lo] = part
    shape = kv_cache.shape[1:]
    kv_cache.index_copy_(0, index, _uncells(cells, len(blocks), shape, kv_cache.dtype))
    return True


def read_record(
    share: StateShare, ids: tuple[int, int], kv_cache: torch.Tensor, blocks: list[int]
) -> torch.Tensor | str:
    """This rank's share of the stream (uint8 [share.length]) from its units in
    ``blocks``, or why the record is refused."""
    index = torch.tensor(blocks, device=kv_cache.device)
    cells = _cells(kv_cache.index_select(0, index)).cpu()
    units = []
    for i in range(share.units):
        unit = _unit(cells[i], ids)
        if isinstance(unit, str):
            return unit
        units.append(unit)
    return _cover(sorted(units, key=lambda u: u.start), share.start, share.length)


def _unit(cell: torch.Tensor, ids: tuple[int, int]) -> Unit | str:
    magic, start, size, crc, id_crc, shape_crc = UNIT.unpack(bytes(cell[: UNIT.size].numpy()))
    if magic != MAGIC:
        return "no state record"
    if shape_crc != ids[1] or HEADER_BYTES + size > cell.numel():
        return "a state of another shape"
    if id_crc != ids[0]:
        return "another request's state"
    data = cell[HEADER_BYTES : HEADER_BYTES + size]
    if _crc(data) != crc:
        return "a corrupt state (checksum)"
    return Unit(start, data)


def _cover(units: list[Unit], start: int, length: int) -> torch.Tensor | str:
    """Bytes ``start .. start + length`` of the stream from contiguous ``units``."""
    first = units[0].start
    stream = torch.cat([u.data for u in units])
    contiguous = all(a.start + a.data.numel() == b.start for a, b in itertools.pairwise(units))
    if not contiguous or first > start or first + stream.numel() < start + length:
        return "a state split otherwise (its units do not cover this rank's share)"
    return stream[start - first : start - first + length]


def _cells(blocks: torch.Tensor) -> torch.Tensor:
    """blocks [n, layers, planes, block_size, heads, row] -> uint8 [heads, capacity]: each
    KV head's cells, block after block (a copy)."""
    raw = blocks.contiguous().view(torch.uint8)
    return raw.permute(4, 0, 1, 2, 3, 5).reshape(raw.shape[4], -1)


def _uncells(cells: torch.Tensor, n: int, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of ``_cells``: [n, *shape] of ``dtype``."""
    layers, planes, size, heads, _ = shape
    raw = cells.reshape(heads, n, layers, planes, size, -1).permute(1, 2, 3, 4, 0, 5)
    return raw.contiguous().view(dtype).reshape(n, *shape)


def _crc(data: torch.Tensor) -> int:
    return zlib.crc32(data.cpu().numpy().tobytes())
