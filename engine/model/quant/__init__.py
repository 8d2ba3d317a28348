"""Quantized weights: the ``quantization`` setting, how a checkpoint's packed weights load
(``gguf_loader``) and how the layers compute with them (``weight``, ``quant_linear.c``)."""

from __future__ import annotations

import json
from pathlib import Path

from models.weights import gguf_file, gguf_files, has_safetensors

QUANTIZATIONS = ("auto", "none", "gguf", "awq", "gptq", "fp8", "mxfp4")  # vLLM's names
# quantization_config.quant_method -> the loader that serves it (safetensors_loader)
# (mxfp4: gpt-oss's packed experts, which the model's MoE layers hold; the rest loads as is)
CHECKPOINT_METHODS = {
    "awq": "awq", "gptq": "gptq", "fp8": "fp8", "compressed-tensors": "fp8", "mxfp4": "mxfp4",
}  # fmt: skip


def checkpoint_quantization(model_dir: Path) -> str | None:
    """The method a checkpoint's config.json declares (``quantization_config``), None when
    it declares none; one we cannot serve raises ValueError naming it."""
    path = Path(model_dir) / "config.json"
    try:
        qc = json.loads(path.read_text()).get("quantization_config")
    except (OSError, ValueError):
        return None  # the config's own reader names what is wrong with it
    if qc is None:
        return None
    method = str(qc.get("quant_method", "")) if isinstance(qc, dict) else ""
    if method.lower() not in CHECKPOINT_METHODS:
        raise ValueError(
            f"{path}: quantization_config.quant_method {method!r} is not supported "
            f"(supported: {', '.join(CHECKPOINT_METHODS)})"
        )
    return CHECKPOINT_METHODS[method.lower()]


def resolve_quantization(
    quantization: str, model_dir: Path, device: str, fp32: bool, checkpoint: bool = True
) -> str:
    """The method the engine loads with. A checkpoint whose config.json declares one (AWQ,
    GPTQ, FP8) loads with it (``auto`` or that name; anything else is refused, naming both);
    otherwise ``auto`` is ``gguf`` for a directory whose weights are a GGUF file alone, and
    for a CPU fp32 engine on one with a GGUF file beside the safetensors (the packed kernels
    compute exactly what its fp32 conversion does), else ``none``. ``gguf`` without a GGUF
    file, or ``none`` with a GGUF but no safetensors, raises ValueError naming the directory."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(
            f"quantization {quantization!r} is not supported (one of {', '.join(QUANTIZATIONS)})"
        )
    declared = checkpoint_quantization(model_dir) if checkpoint else None
    if declared is not None:
        if quantization not in ("auto", declared):
            raise ValueError(
                f"{model_dir}: the checkpoint is {declared}-quantized (config.json "
                f"quantization_config); quantization {quantization!r} cannot load it"
            )
        return declared
    if quantization in CHECKPOINT_METHODS.values():
        raise ValueError(
            f"{model_dir}: quantization {quantization!r} needs a checkpoint whose config.json "
            "has a quantization_config naming it"
        )
    if quantization == "auto":
        wanted = (str(device).startswith("cpu") and fp32) or not has_safetensors(model_dir)
        return "gguf" if checkpoint and wanted and gguf_file(model_dir) is not None else "none"
    if quantization == "gguf":
        require_gguf_file(model_dir)
    elif checkpoint and not has_safetensors(model_dir) and gguf_files(model_dir):
        raise ValueError(
            f"{model_dir}: quantization 'none' loads *.safetensors weights; the directory has "
            f"{gguf_files(model_dir)[0].name} only (use quantization gguf or auto)"
        )
    return quantization


def require_gguf_file(model_dir: Path) -> Path:
    """``gguf_file``, raising ValueError naming the directory when it has none."""
    path = gguf_file(model_dir)
    if path is None:
        raise ValueError(f"{model_dir}: quantization 'gguf' needs a *.gguf file there")
    return path
