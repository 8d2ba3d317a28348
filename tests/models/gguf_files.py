"""Small GGUF files written with gguf's own writer (the reference), and ways to break them:
the inputs of the header checks (models.gguf_header)."""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

# name -> (shape [rows, row length], type): a Q8_0 matrix between two F32 tensors
TENSORS: dict[str, tuple[tuple[int, int], T]] = {
    "token_embd.weight": ((8, 64), T.F32),
    "blk.0.attn_q.weight": ((16, 64), T.Q8_0),
    "output_norm.weight": ((1, 64), T.F32),
}


def write_gguf(path: Path, tensors: dict[str, tuple[tuple[int, int], T]] = TENSORS) -> Path:
    """A GGUF with `tensors` (values random), a tokenizer-like string array and the usual
    metadata; returns `path`."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_token_list([f"tok{i}" for i in range(100)])
    writer.add_token_types([1] * 100)
    for name, (shape, kind) in tensors.items():
        w = rng.standard_normal(shape).astype(np.float32)
        if kind == T.F32:
            writer.add_tensor(name, w if shape[0] > 1 else w[0])
        else:
            writer.add_tensor(name, gguf.quants.quantize(w, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def gguf_bytes() -> bytes:
    """The bytes of `write_gguf`'s file."""
    with tempfile.TemporaryDirectory() as tmp:
        return write_gguf(Path(tmp) / "m.gguf").read_bytes()


def tensor_info_offset(data: bytes, name: str) -> int:
    """Where the offset field of tensor `name`'s table entry lies in the file."""
    at = data.index(struct.pack("<Q", len(name)) + name.encode()) + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    return at + 4 + 8 * n_dims + 4
