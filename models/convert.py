"""Convert a GGUF checkpoint into a plain Hugging Face directory the engine can load.

transformers dequantizes the GGUF; we save fp32 weights with safetensors, the config without
`quantization_config`, the tokenizer files and the generation config. torch, transformers and
safetensors are imported inside the functions so importing this module stays cheap.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class ConversionResult:
    """What `convert_gguf` wrote."""

    out_dir: Path
    num_tensors: int
    num_parameters: int
    seconds: float


class _Steps:
    """Prints one line per conversion step with the elapsed time, to stderr."""

    def __init__(self, enabled: bool, total: int) -> None:
        self._enabled = enabled
        self._total = total
        self._done = 0
        self._start = time.monotonic()

    def step(self, text: str) -> None:
        self._done += 1
        self.say(f"[{self._done}/{self._total}] {text}")

    def say(self, text: str) -> None:
        if self._enabled:
            print(text, file=sys.stderr, flush=True)

    def elapsed(self) -> float:
        return time.monotonic() - self._start


def convert_gguf(
    gguf_path: Path | str, out_dir: Path | str, progress: bool = True
) -> ConversionResult:
    """Dequantize `gguf_path` to fp32 and write a HF directory into `out_dir` (created if needed).

    Writes config.json (no quantization_config, `architectures` filled in), model.safetensors
    (lm_head.weight dropped when the embeddings are tied), the tokenizer files and, when the
    model has one, generation_config.json.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise ValueError(f"GGUF file {gguf_path} not found")
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = _Steps(progress, total=3)
    steps.step(f"loading and dequantizing {gguf_path.name}")
    model, tokenizer = _load(gguf_path, progress)
    steps.step("saving weights")
    tensors = _state_dict_to_save(model)
    _save_weights(tensors, out_dir / WEIGHTS_FILE)
    steps.step("saving config and tokenizer")
    _save_config(model, gguf_path.stem, out_dir / "config.json")
    tokenizer.save_pretrained(out_dir)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out_dir)
    params = sum(t.numel() for t in tensors.values())
    steps.say(
        f"converted {len(tensors)} tensors, {params / 1e6:.1f} M parameters, fp32, "
        f"in {steps.elapsed():.1f} s"
    )
    return ConversionResult(out_dir, len(tensors), params, steps.elapsed())


def _load(gguf_path: Path, progress: bool) -> tuple[Any, Any]:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_logging = transformers.utils.logging
    was_enabled = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, **_dtype_kwarg(torch.float32)
        )
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
    return model, tokenizer


def _dtype_kwarg(dtype: torch.dtype) -> dict[str, torch.dtype]:
    """transformers >= 4.56 names the argument `dtype`; older versions `torch_dtype`."""
    import transformers

    major, minor = (int(p) for p in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def _state_dict_to_save(model: Any) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {
        name: t.detach().contiguous() for name, t in model.state_dict().items()
    }
    if getattr(model.config, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)  # the same storage as embed_tokens
    return tensors


def _save_weights(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "pt"})
    path.chmod(0o644)  # safetensors creates it owner-only; a shared cache must be readable


def _save_config(model: Any, source_name: str, path: Path) -> None:
    data: dict[str, Any] = model.config.to_dict()
    data.pop("quantization_config", None)
    if not data.get("architectures"):
        # transformers leaves this empty when loading from GGUF; the engine needs it.
        data["architectures"] = [type(model).__name__]
    data["_name_or_path"] = source_name
    path.write_text(json.dumps(data, indent=2) + "\n")
