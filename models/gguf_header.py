"""The header and tensor table of a GGUF file (llama.cpp's format), read and checked without
loading a weight: a truncated or corrupt file is refused in milliseconds, naming the file and
what is wrong, before any node starts (models.validate).

Layout (little-endian): ``GGUF``, version (2 or 3), tensor count, metadata count; the metadata
(key, typed value; arrays nest); per tensor its name, dims (row length first), ggml type and
offset into the data section, which starts at the next multiple of ``general.alignment``.
Every tensor must be of a type the engine loads, lie inside the file and overlap no other.
Pure Python (``struct`` over an ``mmap``): only the pages of the header are read.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # ggml's
# ggml type id -> (name, weights per block, bytes per block): the types the engine loads
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    8: ("Q8_0", 32, 34),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
}
TYPE_SIZES = {name: (per_block, size) for name, per_block, size in GGML_TYPES.values()}
# other ggml types, named when a file holds one
_OTHER_TYPES = {6: "Q5_0", 7: "Q5_1", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 15: "Q8_K", 20: "IQ4_NL"}
_OTHER_TYPES |= {23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 30: "BF16"}
# metadata value type -> struct format of a scalar (8: string, 9: array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q"}
_SCALARS |= {12: "d"}
_STRING, _ARRAY = 8, 9


class _Unsupported(Exception):
    """What the engine cannot load in the file, in words (the caller names the file)."""


class _Corrupt(_Unsupported):
    """What is wrong with the file's structure, in words."""


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    dims: tuple[int, ...]  # ggml's order: the row length first
    type_name: str
    offset: int  # from the start of the data section
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    architecture: str  # general.architecture ("" when absent)
    alignment: int
    data_start: int  # file offset of the data section
    tensors: tuple[GGUFTensor, ...]


def read_gguf_header(path: Path | str) -> GGUFHeader:
    """The header and tensor table of the GGUF file ``path``, checked against the file's
    length; ValueError with one line naming the file and the problem."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
            if magic != MAGIC and len(magic) == 4:
                raise _Corrupt(f"it starts with {magic!r}, not {MAGIC!r}")
            size = f.seek(0, 2)
            if size < 24:
                raise _Corrupt(f"{size} bytes, too short for a GGUF header")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _parse(_Cursor(data, size))
    except OSError as exc:
        raise ValueError(f"{path}: unreadable ({exc.strerror or exc})") from None
    except _Corrupt as exc:
        raise ValueError(f"{path}: not a valid GGUF file: {exc}") from None
    except _Unsupported as exc:
        raise ValueError(f"{path}: {exc}") from None


class _Cursor:
    """Reads typed values from the mapped file, refusing reads past its end."""

    def __init__(self, data: mmap.mmap, size: int) -> None:
        self.data, self.size, self.pos = data, size, 0

    def take(self, n: int, what: str) -> int:
        """Skip ``n`` bytes; their offset."""
        start = self.pos
        if n > self.size - start:
            raise _ends_early(what)
        self.pos += n
        return start

    def scalar(self, fmt: str, what: str) -> int | float | bool:
        start = self.take(struct.calcsize(fmt), what)
        return struct.unpack_from("<" + fmt, self.data, start)[0]  # type: ignore[no-any-return]

    def count(self, what: str, min_bytes: int) -> int:
        """A u64 count of items of at least ``min_bytes`` each, which must fit the file."""
        n = int(self.scalar("Q", what))
        if n * min_bytes > self.size - self.pos:
            raise _Corrupt(f"{what} is {n}, more than the rest of the file holds (truncated?)")
        return n

    def skip_strings(self, n: int, what: str) -> None:
        """Skip ``n`` strings (a tokenizer's vocabulary: the hot loop of the header)."""
        data, size, pos = self.data, self.size, self.pos
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(n):
            if pos + 8 > size:
                raise _ends_early(what)
            pos += 8 + unpack(data, pos)[0]
        if pos > size:
            raise _ends_early(what)
        self.pos = pos

    def string(self, what: str) -> str:
        n = self.count(f"the length of {what}", 1)
        start = self.take(n, what)
        try:
            return bytes(self.data[start : start + n]).decode()
        except UnicodeDecodeError:
            raise _Corrupt(f"{what} is not UTF-8") from None


def _ends_early(what: str) -> _Corrupt:
    return _Corrupt(f"the header ends early, in {what} (truncated file?)")


def _parse(cur: _Cursor) -> GGUFHeader:
    cur.take(4, "the magic")  # checked by the caller
    version = int(cur.scalar("I", "the version"))
    if version not in VERSIONS:
        raise _Corrupt(f"version {version} (read: {', '.join(map(str, VERSIONS))})")
    n_tensors = cur.count("tensor count", 24)
    n_fields = cur.count("metadata count", 12)
    fields = _metadata(cur, n_fields)
    alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if type(alignment) is not int or alignment < 1 or alignment & (alignment - 1):
        raise _Corrupt(f"general.alignment {alignment!r} is not a power of two")
    tensors = [_tensor_info(cur, i) for i in range(n_tensors)]
    data_start = -(-cur.pos // alignment) * alignment
    _check_tensors(tensors, data_start, alignment, cur.size)
    arch = fields.get("general.architecture", "")
    return GGUFHeader(version, str(arch), alignment, data_start, tuple(tensors))


def _metadata(cur: _Cursor, n: int) -> dict[str, object]:
    """The metadata's scalar and string values by key (arrays skipped)."""
    fields: dict[str, object] = {}
    for i in range(n):
        key = cur.string(f"metadata key {i}")
        kind = int(cur.scalar("I", f"the type of {key!r}"))
        fields[key] = _value(cur, kind, key)
    return fields


def _value(cur: _Cursor, kind: int, key: str) -> object:
    if kind in _SCALARS:
        return cur.scalar(_SCALARS[kind], repr(key))
    if kind == _STRING:
        return cur.string(repr(key))
    if kind != _ARRAY:
        raise _Corrupt(f"metadata {key!r} has value type {kind}, not one GGUF defines")
    item = int(cur.scalar("I", f"the item type of {key!r}"))
    if item in _SCALARS:
        width = struct.calcsize(_SCALARS[item])
        cur.take(width * cur.count(f"the length of {key!r}", width), repr(key))
        return None
    if item == _STRING:
        cur.skip_strings(cur.count(f"the length of {key!r}", 8), repr(key))
        return None
    for _ in range(cur.count(f"the length of {key!r}", 12)):
        _value(cur, item, key)
    return None


def _tensor_info(cur: _Cursor, i: int) -> GGUFTensor:
    name = cur.string(f"the name of tensor {i}")
    n_dims = int(cur.scalar("I", f"tensor {name!r}"))
    if not 1 <= n_dims <= MAX_DIMS:
        raise _Corrupt(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS})")
    dims = tuple(int(cur.scalar("Q", f"tensor {name!r}")) for _ in range(n_dims))
    type_id = int(cur.scalar("I", f"tensor {name!r}"))
    offset = int(cur.scalar("Q", f"tensor {name!r}"))
    if type_id not in GGML_TYPES:
        known = ", ".join(t[0] for t in GGML_TYPES.values())
        kind = _OTHER_TYPES.get(type_id, f"id {type_id}")
        raise _Unsupported(f"tensor {name!r} has type {kind}, not one the engine loads ({known})")
    type_name, per_block, block_bytes = GGML_TYPES[type_id]
    if dims[0] % per_block:
        raise _Corrupt(
            f"tensor {name!r} has rows of {dims[0]}, not whole {type_name} blocks of {per_block}"
        )
    elements = 1
    for d in dims:
        elements *= d
    return GGUFTensor(name, dims, type_name, offset, elements // per_block * block_bytes)


def _check_tensors(tensors: list[GGUFTensor], data_start: int, alignment: int, size: int) -> None:
    """Names unique, offsets aligned, each tensor inside the file and apart from the others."""
    names: set[str] = set()
    end = 0
    for t in sorted(tensors, key=lambda t: t.offset):
        if t.name in names:
            raise _Corrupt(f"tensor {t.name!r} is listed twice")
        names.add(t.name)
        if t.offset % alignment:
            raise _Corrupt(f"tensor {t.name!r} starts at offset {t.offset}, not a multiple of "
                           f"the alignment {alignment}")  # fmt: skip
        if t.offset < end:
            raise _Corrupt(f"tensor {t.name!r} overlaps the one before it")
        end = t.offset + t.nbytes
        if data_start + end > size:
            raise _Corrupt(
                f"tensor {t.name!r} ends at byte {data_start + end}, past the end of the file "
                f"({size} bytes: truncated?)"
            )
