"""Test helper: a transformers model saved as an AWQ, GPTQ or FP8 checkpoint in the published
layouts, its own weights replaced by the dequantized ones (the oracle runs those)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from int4_writer import awq_tensors, dequantize, gptq_tensors, quantize
from safetensors.torch import save_file

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# modules that read the same input share GPTQ's activation order
SHARED_INPUT = {
    "q_proj": "qkv",
    "k_proj": "qkv",
    "v_proj": "qkv",
    "gate_proj": "gu",
    "up_proj": "gu",
}

INT4_CONFIGS: dict[str, dict[str, Any]] = {
    "awq": {
        "quant_method": "awq",
        "bits": 4,
        "group_size": 32,
        "version": "gemm",
        "zero_point": True,
    },
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": False},
    "gptq_act_order": {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True},
}
FP8_CONFIGS: dict[str, dict[str, Any]] = {
    "fp8_tensor": {"quant_method": "fp8", "activation_scheme": "dynamic"},
    "fp8_block": {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "weight_block_size": [16, 32],
    },
    "fp8_channel": {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
            }
        },
        "ignore": ["lm_head"],
    },
}
SCHEMES = [*INT4_CONFIGS, *FP8_CONFIGS]


def save_quantized(model: Any, path: Path, scheme: str, seed: int = 0) -> None:
    """Save ``model`` to ``path`` with its linear layers quantized by ``scheme``; the model's
    linear weights become the dequantized values."""
    model.save_pretrained(path)
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    perms: dict[tuple[str, str], torch.Tensor] = {}
    with torch.no_grad():
        for name, param in model.state_dict().items():
            prefix, _, kind = name.rpartition(".")
            module = prefix.rpartition(".")[2]
            if module not in LINEARS or kind != "weight":
                tensors[name] = param.contiguous()
                continue
            if scheme in INT4_CONFIGS:
                w, packed = _int4(param, scheme, perms, prefix, module, gen)
            else:
                w, packed = _fp8(param, scheme)
            param.copy_(w)
            tensors |= {f"{prefix}.{k}": v for k, v in packed.items()}
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    for old in path.glob("*.safetensors"):
        old.unlink()
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = (INT4_CONFIGS | FP8_CONFIGS)[scheme]
    (path / "config.json").write_text(json.dumps(config))


def _int4(
    param: torch.Tensor,
    scheme: str,
    perms: dict[tuple[str, str], torch.Tensor],
    prefix: str,
    module: str,
    gen: torch.Generator,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    perm = None
    if scheme == "gptq_act_order":
        key = (prefix.rpartition(".")[0], SHARED_INPUT.get(module, module))
        if key not in perms:
            perms[key] = torch.randperm(param.shape[1], generator=gen)
        perm = perms[key]
    # code column j quantizes input column perm[j]
    ordered = param if perm is None else param[:, perm]
    codes, zeros, scales = quantize(ordered, group=32)
    w = dequantize(codes, zeros, scales)
    if perm is not None:
        w = torch.empty_like(w).index_copy_(1, perm, w)
    if scheme == "awq":
        return w, awq_tensors(codes, zeros, scales)
    return w, gptq_tensors(codes, zeros, scales, v1=True, perm=perm)


def _fp8(param: torch.Tensor, scheme: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    out, inp = param.shape
    if scheme == "fp8_tensor":
        scale = param.abs().max() / 448
        codes = (param / scale).to(torch.float8_e4m3fn)
        return codes.float() * scale, {"weight": codes, "weight_scale": scale.reshape(())}
    if scheme == "fp8_channel":
        scale = param.abs().amax(1, keepdim=True) / 448
        codes = (param / scale).to(torch.float8_e4m3fn)
        return codes.float() * scale, {"weight": codes, "weight_scale": scale}
    bn, bk = 16, 32
    tiles = param.view(out // bn, bn, inp // bk, bk)
    scale = tiles.abs().amax(dim=(1, 3)) / 448  # [out / bn, in / bk]
    full = scale.repeat_interleave(bn, 0).repeat_interleave(bk, 1)
    codes = (param / full).to(torch.float8_e4m3fn)
    return codes.float() * full, {"weight": codes, "weight_scale_inv": scale}
