"""A Hugging Face checkpoint's safetensors files, which both loaders read: the full-precision
one (engine.model.loader) and the quantized one (engine.model.quant.safetensors_loader)."""

from __future__ import annotations

import json
from pathlib import Path

INDEX = "model.safetensors.index.json"
# Present in some checkpoints, never needed: RoPE is recomputed, a tied head is the embedding.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint: those named by the index, else all of them."""
    index = model_dir / INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: no 'weight_map' object")
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir}: no *.safetensors files")
    return files
