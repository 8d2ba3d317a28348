"""The GGUF header check: what gguf's reader finds in a good file, and one line naming the
file and the problem for a truncated, corrupt or unloadable one, read in milliseconds."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader

from models.gguf_header import read_gguf_header
from tests.models.gguf_files import TENSORS, tensor_info_offset, write_gguf


def _error(path: Path) -> str:
    with pytest.raises(ValueError) as info:
        read_gguf_header(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    return message


def test_the_table_is_what_ggufs_reader_finds(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    header = read_gguf_header(path)
    reader = GGUFReader(path)
    want = {t.name: (t.data_offset, t.n_bytes, t.tensor_type.name) for t in reader.tensors}
    got = {t.name: (header.data_start + t.offset, t.nbytes, t.type_name) for t in header.tensors}
    assert got == want and set(got) == set(TENSORS)
    assert (header.version, header.architecture, header.alignment) == (3, "llama", 32)


def test_the_default_models_gguf_is_read(default_model_dir: Path) -> None:
    files = list(default_model_dir.glob("*.gguf"))
    if not files:
        pytest.skip("SPLITSERVE_TEST_MODEL_DIR points at a copy without the GGUF")
    header = read_gguf_header(files[0])
    assert header.architecture == "llama" and len(header.tensors) == 272
    end = max(header.data_start + t.offset + t.nbytes for t in header.tensors)
    assert end == files[0].stat().st_size


def test_a_file_cut_in_its_weights_names_the_tensor_past_the_end(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    message = _error(path)
    assert "tensor 'output_norm.weight' ends at byte" in message
    assert f"past the end of the file ({len(data) - 100} bytes: truncated?)" in message


@pytest.mark.parametrize("keep", [30, 200, 1500])
def test_a_file_cut_in_its_header_is_refused(tmp_path: Path, keep: int) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    path.write_bytes(path.read_bytes()[:keep])
    message = _error(path)
    assert "not a valid GGUF file" in message and "truncated" in message


def test_not_a_gguf_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"<html>Not Found</html>" * 4)
    assert "not a valid GGUF file: it starts with b'<htm', not b'GGUF'" in _error(path)
    path.write_bytes(b"")
    assert "0 bytes, too short for a GGUF header" in _error(path)


def test_an_unknown_version_is_refused(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    data = bytearray(path.read_bytes())
    data[4:8] = struct.pack("<I", 7)
    path.write_bytes(bytes(data))
    assert "version 7 (read: 2, 3)" in _error(path)


def test_a_corrupt_count_is_refused_without_reading_on(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    data = bytearray(path.read_bytes())
    data[8:16] = struct.pack("<Q", 2**60)  # the tensor count
    path.write_bytes(bytes(data))
    assert f"tensor count is {2**60}, more than the rest of the file holds" in _error(path)


def test_overlapping_and_misaligned_tensors_are_refused(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    data = bytearray(path.read_bytes())
    at = tensor_info_offset(bytes(data), "output_norm.weight")
    data[at : at + 8] = struct.pack("<Q", 32)  # inside token_embd's bytes
    path.write_bytes(bytes(data))
    assert "tensor 'output_norm.weight' overlaps the one before it" in _error(path)
    data[at : at + 8] = struct.pack("<Q", 33)
    path.write_bytes(bytes(data))
    assert "starts at offset 33, not a multiple of the alignment 32" in _error(path)


def test_a_type_the_engine_does_not_load_is_named(tmp_path: Path) -> None:
    tensors = TENSORS | {"blk.0.attn_k.weight": ((16, 64), T.BF16)}
    path = write_gguf(tmp_path / "m.gguf", tensors)
    message = _error(path)
    assert "tensor 'blk.0.attn_k.weight' has type BF16, not one the engine loads" in message
    assert "valid" not in message  # a good file, of a type not served
