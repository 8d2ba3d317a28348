"""Reading a LoRA adapter in the PEFT layout, without peft.

A directory holds ``adapter_config.json`` (``r``, ``lora_alpha``, ``target_modules``,
``use_rslora``...) and ``adapter_model.safetensors`` with, per adapted linear layer,
``...layers.{i}.{self_attn|mlp}.{module}.lora_A.weight`` [r, in] and ``lora_B.weight``
[out, r]. The delta of a layer is ``scaling * B @ A``, scaling ``alpha / r`` (rsLoRA:
``alpha / sqrt(r)``); B is stored here pre-scaled. Anything this engine does not apply
(DoRA, biases, extra trained modules, per-module ranks, embeddings) is refused by name.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# the linear layers an adapter may target, by their checkpoint module names
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_TENSOR = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


class LoraLoadError(ValueError):
    """An adapter that cannot be served; the message names the file and what is wrong."""


@dataclass(frozen=True)
class LoraAdapter:
    """An adapter's matrices on the host: (layer, module) -> (A [r, in], scaling * B [out, r])."""

    name: str
    path: Path
    rank: int
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def modules(self) -> frozenset[str]:
        return frozenset(module for _, module in self.weights)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


def load_adapter(name: str, path: Path, max_rank: int) -> LoraAdapter:
    """The adapter in PEFT directory `path`; LoraLoadError naming the file when it cannot
    be served (missing, unreadable, a rank above `max_rank`, an unsupported option)."""
    config = _read_config(path / CONFIG_FILE)
    rank, scaling = _rank_and_scaling(config, path / CONFIG_FILE, max_rank)
    weights_file = path / WEIGHTS_FILE
    if not weights_file.is_file():
        raise LoraLoadError(f"{weights_file}: missing (adapter {name!r} needs {WEIGHTS_FILE})")
    try:
        tensors = _read_tensors(weights_file)
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise LoraLoadError(f"{weights_file}: not a readable safetensors file ({exc})") from None
    weights = _pair_up(tensors, weights_file, rank, scaling)
    if not weights:
        raise LoraLoadError(f"{weights_file}: no lora_A / lora_B weights of {TARGET_MODULES}")
    return LoraAdapter(name, path, rank, weights)


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise LoraLoadError(f"{path}: missing (not a PEFT adapter directory)")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LoraLoadError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise LoraLoadError(f"{path}: expected a JSON object")
    return config


def _rank_and_scaling(config: dict[str, Any], path: Path, max_rank: int) -> tuple[int, float]:
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise LoraLoadError(f"{path}: 'r' must be an integer >= 1, got {rank!r}")
    if rank > max_rank:
        raise LoraLoadError(f"{path}: rank {rank} is above max_lora_rank {max_rank}")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool):
        raise LoraLoadError(f"{path}: 'lora_alpha' must be a number, got {alpha!r}")
    for key, allowed in (("use_dora", (False, None)), ("bias", ("none", None))):
        if config.get(key) not in allowed:
            raise LoraLoadError(f"{path}: {key}={config[key]!r} is not supported")
    for key in ("rank_pattern", "alpha_pattern", "modules_to_save", "layers_pattern"):
        if config.get(key):
            raise LoraLoadError(f"{path}: {key} is not supported (got {config[key]!r})")
    if config.get("fan_in_fan_out"):
        raise LoraLoadError(f"{path}: fan_in_fan_out is not supported")
    root = math.sqrt(rank) if config.get("use_rslora") else rank
    return rank, float(alpha) / root


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as f:  # type: ignore[no-untyped-call]
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no iter)


def _pair_up(
    tensors: dict[str, torch.Tensor], path: Path, rank: int, scaling: float
) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _TENSOR.search(key)
        if match is None or match.group(2) not in TARGET_MODULES:
            raise LoraLoadError(f"{path}: tensor {key!r} is not a LoRA weight of {TARGET_MODULES}")
        layer, module, half = int(match.group(1)), match.group(2), match.group(3)
        halves.setdefault((layer, module), {})[half] = tensor.to(torch.float32)
    weights = {}
    for (layer, module), pair in sorted(halves.items()):
        a, b = pair.get("A"), pair.get("B")
        where = f"layer {layer} {module}"
        if a is None or b is None:
            raise LoraLoadError(f"{path}: {where} has only one of lora_A and lora_B")
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != rank or b.shape[1] != rank:
            raise LoraLoadError(
                f"{path}: {where}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not "
                f"have rank {rank}"
            )
        weights[(layer, module)] = (a.contiguous(), (b * scaling).contiguous())
    return weights
