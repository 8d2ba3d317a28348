"""A Hugging Face checkpoint's safetensors files, which both loaders read: the full-precision
one (engine.model.loader) and the quantized one (engine.model.quant.safetensors_loader)."""

from __future__ import annotations

import json
from pathlib import Path

INDEX = "model.safetensors.index.json"
# Present in some checkpoints, never needed: RoPE is recomputed, a tied head is the embedding.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# An image-text model's text part (Gemma 3): transformers 5's and 4's names -> a causal LM's
TEXT_MODEL_PREFIXES = {
    "model.language_model.": "model.",
    "language_model.model.": "model.",
    "language_model.lm_head.": "lm_head.",
}
# its image side, which the engine does not serve
VISION_PREFIXES = (
    "model.vision_tower.", "vision_tower.", "model.multi_modal_projector.",
    "multi_modal_projector.",
)  # fmt: skip


def text_model_name(name: str) -> str | None:
    """A checkpoint tensor's name as the text model's (the causal LM's own), or None for the
    vision tower's and the projector's, which are not read."""
    if name.startswith(VISION_PREFIXES):
        return None
    for prefix, text in TEXT_MODEL_PREFIXES.items():
        if name.startswith(prefix):
            return text + name[len(prefix) :]
    return name


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
