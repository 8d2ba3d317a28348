"""Load Hugging Face safetensors checkpoints into ``LlamaModel``.

Each checkpoint tensor is copied straight into its slice of the engine weight (q/k/v into the
fused ``qkv`` rows, gate/up into ``gate_up``), converting dtype and device on the way; no fused
copy is ever built on the side. Missing, unexpected or misshapen tensors raise ValueError.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from engine.model.llama import LlamaModel

_INDEX = "model.safetensors.index.json"
# Present in some checkpoints, never needed: RoPE is recomputed, a tied head is the embedding.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint: those named by the index, else all of them."""
    index = model_dir / _INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: no 'weight_map' object")
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir}: no *.safetensors files")
    return files


def weight_targets(model: LlamaModel) -> dict[str, torch.Tensor]:
    """HF tensor name -> the engine weight (or fused slice) it fills."""
    cfg = model.config
    q, kv, inter = cfg.q_size, cfg.kv_size, cfg.intermediate_size
    targets = {"model.embed_tokens.weight": model.embed.data, "model.norm.weight": model.norm.data}
    if not cfg.tie_word_embeddings:
        targets["lm_head.weight"] = model.lm_head.data
    for i, layer in enumerate(model.decoder_layers()):
        p = f"model.layers.{i}."
        targets |= {
            p + "input_layernorm.weight": layer.input_norm.data,
            p + "self_attn.q_proj.weight": layer.qkv.data[:q],
            p + "self_attn.k_proj.weight": layer.qkv.data[q : q + kv],
            p + "self_attn.v_proj.weight": layer.qkv.data[q + kv :],
            p + "self_attn.o_proj.weight": layer.o_proj.data,
            p + "post_attention_layernorm.weight": layer.post_norm.data,
            p + "mlp.gate_proj.weight": layer.gate_up.data[:inter],
            p + "mlp.up_proj.weight": layer.gate_up.data[inter:],
            p + "mlp.down_proj.weight": layer.down.data,
        }
    return targets


def load_weights(model: LlamaModel, model_dir: str | Path) -> None:
    """Fill every weight of ``model`` from the checkpoint in ``model_dir``."""
    model_dir = Path(model_dir)
    targets = weight_targets(model)
    filled: set[str] = set()
    with torch.no_grad():
        for path, name, tensor in _tensors(checkpoint_files(model_dir)):
            if _ignored(name, model):
                continue
            target = targets.get(name)
            if target is None:
                raise ValueError(f"{path}: unexpected tensor {name!r}")
            if tuple(tensor.shape) != tuple(target.shape):
                raise ValueError(
                    f"{path}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                    f"expected {tuple(target.shape)}"
                )
            target.copy_(tensor)
            filled.add(name)
    missing = sorted(set(targets) - filled)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"{model_dir}: checkpoint lacks tensor {missing[0]!r}{more}")


def _tensors(files: list[Path]) -> Iterator[tuple[Path, str, torch.Tensor]]:
    for path in files:
        if not path.is_file():
            raise ValueError(f"{path}: safetensors file named by the index is missing")
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield path, name, f.get_tensor(name)


def _ignored(name: str, model: LlamaModel) -> bool:
    if name.endswith(_IGNORED_SUFFIXES):
        return True
    return name == "lm_head.weight" and model.config.tie_word_embeddings


def init_random_weights(model: LlamaModel, seed: int = 0) -> None:
    """Seeded random weights of the right scale, made on the model's device (no checkpoint).

    Matrices ~ N(0, 1 / fan_in), norm weights ~ 1 + N(0, 0.04): activations stay in range
    through any depth, so a random model's steps cost what a trained one's do.
    """
    device = model.embed.device
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for target in weight_targets(model).values():
            noise = torch.randn(target.shape, generator=gen, device=device, dtype=torch.float32)
            if target.dim() == 1:
                target.copy_(noise.mul_(0.2).add_(1.0))
            else:
                target.copy_(noise.mul_(target.shape[-1] ** -0.5))
