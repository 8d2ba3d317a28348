"""Quantized weights: the ``quantization`` setting, how a checkpoint's packed weights load
(``gguf_loader``) and how the layers compute with them (``weight``, ``quant_linear.c``)."""

from __future__ import annotations

from pathlib import Path

QUANTIZATIONS = ("auto", "none", "gguf")  # EngineConfig.quantization (vLLM's names)


def gguf_file(model_dir: Path) -> Path | None:
    """The GGUF checkpoint of a model directory: its one ``*.gguf`` file, None if it has
    none; several are refused (which one is meant?)."""
    files = sorted(Path(model_dir).glob("*.gguf"))
    if len(files) > 1:
        names = ", ".join(f.name for f in files)
        raise ValueError(f"{model_dir}: several GGUF files ({names}); keep one")
    return files[0] if files else None


def resolve_quantization(
    quantization: str, model_dir: Path, device: str, fp32: bool, checkpoint: bool = True
) -> str:
    """``none`` or ``gguf``: ``auto`` is ``gguf`` for a CPU fp32 engine on a directory with a
    GGUF file (the packed kernels compute exactly what its fp32 conversion does), else
    ``none``. ``gguf`` without a GGUF file raises ValueError naming the directory."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(
            f"quantization {quantization!r} is not supported (one of {', '.join(QUANTIZATIONS)})"
        )
    if quantization == "auto":
        cpu = str(device).startswith("cpu") and fp32 and checkpoint
        return "gguf" if cpu and gguf_file(model_dir) is not None else "none"
    if quantization == "gguf":
        require_gguf_file(model_dir)
    return quantization


def require_gguf_file(model_dir: Path) -> Path:
    """``gguf_file``, raising ValueError naming the directory when it has none."""
    path = gguf_file(model_dir)
    if path is None:
        raise ValueError(f"{model_dir}: quantization 'gguf' needs a *.gguf file there")
    return path
