"""The ``quantization`` setting: unknown names refused before anything loads, ``auto``
resolved from the device, the dtype and the model directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.model.quant import resolve_quantization
from engine.step.model_load import engine_quantization


def test_unknown_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError,
        match=r"quantization must be one of auto, none, gguf, awq, gptq, fp8, mxfp4, got 'awq4'",
    ):
        EngineConfig(model_dir=tmp_path, quantization="awq4")


def test_matmul_precisions_other_than_highest_and_medium_are_refused(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"float32_matmul_precision must be one of highest, medium, got 'high'"
    ):
        EngineConfig(model_dir=tmp_path, float32_matmul_precision="high")


def test_auto_serves_the_gguf_on_a_cpu_fp32_engine(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    assert resolve_quantization("auto", tmp_path, "cpu", fp32=True) == "none"
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    assert resolve_quantization("auto", tmp_path, "cpu", fp32=True) == "gguf"
    assert resolve_quantization("auto", tmp_path, "cuda:0", fp32=True) == "none"
    assert resolve_quantization("auto", tmp_path, "cpu", fp32=False) == "none"
    assert resolve_quantization("auto", tmp_path, "cpu", True, checkpoint=False) == "none"
    assert resolve_quantization("none", tmp_path, "cpu", fp32=True) == "none"


def test_gguf_needs_exactly_one_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"quantization 'gguf' needs a \*\.gguf file there"):
        resolve_quantization("gguf", tmp_path, "cpu", fp32=True)
    (tmp_path / "a.gguf").write_bytes(b"GGUF")
    (tmp_path / "b.gguf").write_bytes(b"GGUF")
    with pytest.raises(ValueError, match=r"several GGUF files \(a\.gguf, b\.gguf\)"):
        resolve_quantization("gguf", tmp_path, "cpu", fp32=True)


def test_a_gguf_alone_is_served_whatever_the_engine(tmp_path: Path) -> None:
    """No safetensors: the GGUF is the weights, on any device and dtype."""
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    for device, fp32 in (("cpu", True), ("cpu", False), ("cuda:0", True)):
        assert resolve_quantization("auto", tmp_path, device, fp32) == "gguf"
        assert resolve_quantization("gguf", tmp_path, device, fp32) == "gguf"
    assert resolve_quantization("auto", tmp_path, "cpu", True, checkpoint=False) == "none"
    with pytest.raises(
        ValueError, match=r"quantization 'none' loads \*\.safetensors weights; the directory "
        r"has m\.gguf only \(use quantization gguf or auto\)",
    ):  # fmt: skip
        resolve_quantization("none", tmp_path, "cpu", fp32=True)


def test_tensor_parallelism_refuses_a_gguf_alone(tmp_path: Path) -> None:
    """With safetensors beside it, ``auto`` falls back on them; alone, the GGUF is refused."""
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    config = EngineConfig(model_dir=tmp_path, tensor_parallel_size=2)
    with pytest.raises(ValueError, match=r"not sharded across ranks yet \(.* has no safetensors"):
        engine_quantization(config)
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    assert engine_quantization(config) == "none"
