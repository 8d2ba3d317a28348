"""Load Hugging Face safetensors checkpoints into ``DecoderModel``.

Each checkpoint tensor is copied straight into its slice of the engine weight (q/k/v into the
fused ``qkv`` rows, gate/up into ``gate_up``, each expert into its slot of the fused expert
weights), converting dtype and device on the way; no fused copy is ever built on the side.
A tensor-parallel rank reads only its part of each tensor (``engine.model.shard_load``).
The layer objects name the tensors they take (``weight_targets``). Missing, unexpected or
misshapen tensors raise ValueError naming the file and the tensor.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from engine.model import shard_load
from engine.model.checkpoint_files import IGNORED_SUFFIXES, checkpoint_files, text_model_name
from engine.model.decoder import DecoderModel
from engine.model.quant.mxfp4 import Mxfp4Experts


def weight_targets(
    model: DecoderModel, names: Collection[str] | None = None
) -> dict[str, torch.Tensor]:
    """HF tensor name -> the engine weight (or fused slice) it fills; ``names``, the
    checkpoint's tensor names, pick between layouts where a family has two (experts)."""
    return model.weight_targets(names)


def tensor_names(files: list[Path]) -> set[str]:
    """Every tensor name in the checkpoint files (their headers only)."""
    names: set[str] = set()
    for path in files:
        if not path.is_file():
            raise ValueError(f"{path}: safetensors file named by the index is missing")
        with safe_open(str(path), framework="pt") as f:
            names.update(n for n in map(text_model_name, f.keys()) if n is not None)
    return names


def load_weights(model: DecoderModel, model_dir: str | Path, quantization: str = "none") -> None:
    """Fill every weight of ``model`` from the checkpoint in ``model_dir``: its safetensors,
    or with ``quantization`` "gguf" its GGUF file, quantized weights kept packed."""
    model_dir = Path(model_dir)
    if quantization == "gguf":
        from engine.model.quant import require_gguf_file
        from engine.model.quant.gguf_loader import load_gguf

        return load_gguf(model, require_gguf_file(model_dir))
    if quantization in ("awq", "gptq", "fp8"):
        from engine.model.quant.safetensors_loader import load_quantized

        return load_quantized(model, model_dir, quantization)
    files = checkpoint_files(model_dir)
    targets = weight_targets(model, tensor_names(files))
    offset = model.config.norm_offset
    offset_norms = {t.data_ptr() for t in model.norm_weights()} if offset else set()
    filled: set[str] = set()
    with torch.no_grad():
        for path, name, tensor in _tensors(files, model):
            if tensor is None or _ignored(name, model):
                continue
            target = targets.get(name)
            if target is None:
                raise ValueError(f"{path}: unexpected tensor {name!r}")
            if tuple(tensor.shape) != tuple(target.shape):
                raise ValueError(
                    f"{path}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                    f"expected {tuple(target.shape)}"
                )
            if target.data_ptr() in offset_norms:  # Gemma's (1 + w), summed in fp32 once
                tensor = tensor.float() + offset
            target.copy_(tensor)
            filled.add(name)
    missing = sorted(set(targets) - filled)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"{model_dir}: checkpoint lacks tensor {missing[0]!r}{more}")


def _tensors(
    files: list[Path], model: DecoderModel
) -> Iterator[tuple[Path, str, torch.Tensor | None]]:
    """Each tensor's part this model holds (all of it on one rank; a tensor-parallel rank
    reads only its slice, None for another rank's expert or another pipeline stage's
    tensor, which is not read)."""
    tied = model.config.tie_word_embeddings
    for path in files:
        if not path.is_file():
            raise ValueError(f"{path}: safetensors file named by the index is missing")
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                name = text_model_name(key)
                if name is None:
                    continue
                if not model.stage.holds(name, tied):
                    yield path, name, None
                    continue
                yield path, name, shard_load.read(f, name, model.config, model.shard, key)


def _ignored(name: str, model: DecoderModel) -> bool:
    if name.endswith(IGNORED_SUFFIXES):
        return True
    return name == "lm_head.weight" and model.config.tie_word_embeddings


def init_random_weights(model: DecoderModel, seed: int = 0) -> None:
    """Seeded random weights of the right scale, made on the model's device (no checkpoint).

    Matrices ~ N(0, 1 / fan_in) (MXFP4 experts quantized from such), norm weights ~ 1 +
    N(0, 0.04): activations stay in range through any depth, so a random model's steps cost
    what a trained one's do.
    """
    device = model.embed.device
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for target in weight_targets(model).values():
            if target.dtype == torch.uint8:
                continue  # packed MXFP4 codes and scales: below
            noise = torch.randn(target.shape, generator=gen, device=device, dtype=torch.float32)
            if target.dim() == 1:
                target.copy_(noise.mul_(0.2).add_(1.0))
            else:
                target.copy_(noise.mul_(target.shape[-1] ** -0.5))
        for module in model.modules():
            if isinstance(module, Mxfp4Experts):
                module.init_random(gen)
