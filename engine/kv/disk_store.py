"""The disk tier's files: one KV block per file, named by its chained hash.

A file is a header, the block's token ids, then the payload (the block's bytes, all layers):

    magic "SSKVBLK1" | u32 version | 16 bytes layout fingerprint | u64 block hash
    | u8 has parent | u64 parent hash | u32 tokens | u64 payload bytes
    | u32 CRC-32 of tokens + payload | i64 x tokens | payload

It is written under a temporary name and renamed, so a reader sees a whole file or none. At
start `scan` re-indexes the directory: a file whose magic, version, fingerprint, length,
checksum or chained hash is wrong is deleted and counted by reason, never served; a load
checks the checksum again. The checksum guards against torn or rotted files, not against
someone who may write the directory (nothing can: they could write a valid file). CRC-32
(version 2) replaced BLAKE2b (version 1): hashing was three quarters of a write's time.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.kv.cache import KVLayout
from engine.kv.tier_index import TierEntry
from models.block_hash import block_hash

log = logging.getLogger("splitserve.engine.kv.disk_store")

MAGIC = b"SSKVBLK1"
VERSION = 2
SUFFIX = ".kvb"
_HEADER = struct.Struct("<8sI16sQBQIQI")


class KVFileError(ValueError):
    """A block file that must not be served; `reason` says why."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"KV block file {path.name}: {reason}")
        self.reason = reason


@dataclass(frozen=True)
class ScanResult:
    entries: list[TierEntry]  # good files, oldest first
    dropped: Counter[str]  # bad files deleted, by reason


class DiskStore:
    """Block files under `path` for one cache layout."""

    def __init__(self, path: Path, layout: KVLayout) -> None:
        self.path = Path(path)
        self.layout = layout
        self._fingerprint = layout.fingerprint().encode()
        if len(self._fingerprint) != 16:
            raise ValueError(f"layout fingerprint must be 16 characters: {layout.fingerprint()}")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"kv_offload_disk_path {str(path)!r} is not usable: {exc}") from exc

    def file_bytes(self, num_tokens: int) -> int:
        return _HEADER.size + 8 * num_tokens + self.layout.block_bytes

    def file_of(self, hash_: int) -> Path:
        return self.path / f"{hash_:016x}{SUFFIX}"

    def write(self, entry: TierEntry, block: torch.Tensor) -> None:
        """Write one block (a host tensor of the layout's block shape)."""
        payload = block.contiguous().view(torch.uint8).reshape(-1).numpy().data
        tokens = struct.pack(f"<{len(entry.token_ids)}q", *entry.token_ids)
        parent = entry.parent_hash
        header = _HEADER.pack(
            MAGIC, VERSION, self._fingerprint, entry.block_hash, parent is not None, parent or 0,
            len(entry.token_ids), len(payload), _checksum(tokens, payload),
        )  # fmt: skip
        final = self.file_of(entry.block_hash)
        temp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        with open(temp, "wb") as f:
            f.write(header + tokens)
            f.write(payload)  # from the host tier's memory, no copy
        os.replace(temp, final)

    def read(self, entry: TierEntry) -> torch.Tensor:
        """The block of `entry`, checked: a host tensor of the layout's block shape."""
        path = self.file_of(entry.block_hash)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise KVFileError(path, f"unreadable ({exc})") from exc
        found, payload = self._parse(path, data)
        if (found.block_hash, found.parent_hash, found.token_ids) != (
            entry.block_hash,
            entry.parent_hash,
            entry.token_ids,
        ):
            raise KVFileError(path, "holds another block than its index entry")
        flat = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        return flat.view(self.layout.torch_dtype).view(self.layout.block_shape)

    def delete(self, entry: TierEntry) -> None:
        self.file_of(entry.block_hash).unlink(missing_ok=True)

    def scan(self) -> ScanResult:
        """Index the files found (oldest first); delete bad ones and leftover temporaries."""
        good: list[tuple[float, str, TierEntry]] = []
        dropped: Counter[str] = Counter()
        for path in self.path.iterdir():
            if path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)
                dropped["unfinished"] += 1
                continue
            if path.suffix != SUFFIX or not path.is_file():
                continue
            try:
                entry, _ = self._parse(path, path.read_bytes())
                if path.name != self.file_of(entry.block_hash).name:
                    raise KVFileError(path, "named after another block")
            except (KVFileError, OSError) as exc:
                reason = exc.reason if isinstance(exc, KVFileError) else "unreadable"
                log.warning("kv_disk_file_dropped file=%s reason=%s", path.name, reason)
                dropped[reason] += 1
                path.unlink(missing_ok=True)
                continue
            good.append((path.stat().st_mtime, path.name, entry))
        good.sort(key=lambda item: (item[0], item[1]))
        return ScanResult([e for _, _, e in good], dropped)

    def _parse(self, path: Path, data: bytes) -> tuple[TierEntry, bytes]:
        if len(data) < _HEADER.size:
            raise KVFileError(path, "truncated")
        magic, version, fingerprint, hash_, has_parent, parent, n, size, checksum = (
            _HEADER.unpack_from(data)
        )
        if magic != MAGIC:
            raise KVFileError(path, "not a block file")
        if version != VERSION:
            raise KVFileError(path, f"version {version}, expected {VERSION}")
        if fingerprint != self._fingerprint:
            raise KVFileError(path, "foreign layout")
        if size != self.layout.block_bytes or n != self.layout.block_size:
            raise KVFileError(path, "foreign layout")
        if len(data) != _HEADER.size + 8 * n + size:
            raise KVFileError(path, "truncated")
        tokens = data[_HEADER.size : _HEADER.size + 8 * n]
        payload = data[_HEADER.size + 8 * n :]
        if _checksum(tokens, payload) != checksum:
            raise KVFileError(path, "checksum")
        token_ids = struct.unpack(f"<{n}q", tokens)
        parent_hash = parent if has_parent else None
        if block_hash(parent_hash, token_ids) != hash_:
            raise KVFileError(path, "checksum")
        return TierEntry(hash_, parent_hash, tuple(token_ids), 0), payload


def _checksum(tokens: bytes, payload: bytes | memoryview) -> int:
    return zlib.crc32(payload, zlib.crc32(tokens))
