"""Which checkpoint tensors fill a mixture-of-experts block: the hub layouts of Mixtral,
Qwen2-MoE / Qwen3-MoE and DeepSeek, transformers 5's fused layout, and gpt-oss's (biases,
interleaved gate / up columns, MXFP4 blocks and scales)."""

from __future__ import annotations

from collections.abc import Collection

import torch

from engine.model.moe import SparseMoe
from engine.model.quant.mxfp4 import Mxfp4Experts

NAMINGS = ("mixtral", "qwen_moe", "fused", "deepseek", "gpt_oss")


def weight_targets(block: SparseMoe, prefix: str, naming: str) -> dict[str, torch.Tensor]:
    """Checkpoint tensor name -> the tensor (or view) of ``block`` it fills, same shape.

    ``prefix`` is the layer's, e.g. ``"model.layers.3."``. Namings:
    - ``"mixtral"``: the hub layout of Mixtral, ``block_sparse_moe.gate`` and per-expert
      ``block_sparse_moe.experts.{e}.w1 / w3 / w2`` (gate / up / down);
    - ``"qwen_moe"``: the hub layout of Qwen2-MoE and Qwen3-MoE, ``mlp.gate`` and per-expert
      ``mlp.experts.{e}.gate_proj / up_proj / down_proj``, plus ``mlp.shared_expert.*`` and
      ``mlp.shared_expert_gate`` with a shared expert. transformers 5 ``save_pretrained``
      writes these two by default;
    - ``"fused"``: transformers 5's own layout (its modules' state dicts, and
      ``save_pretrained(save_original_format=False)``) for all three families: ``mlp.gate``,
      ``mlp.experts.gate_up_proj`` [E, 2 I, H] and ``mlp.experts.down_proj`` [E, H, I] (the
      shapes of ``w13`` and ``w2``), the shared expert named as in ``"qwen_moe"``;
    - ``"deepseek"``: as ``"qwen_moe"``, with ``mlp.shared_experts.*`` (no gate) and V3's
      ``mlp.gate.e_score_correction_bias``;
    - ``"gpt_oss"``: ``gpt_oss_targets``.
    ``checkpoint_naming`` tells the layouts apart from a checkpoint's tensor names.
    """
    if naming not in NAMINGS:
        raise ValueError(f"MoE weight naming {naming!r} is not one of {NAMINGS}")
    if naming == "gpt_oss":
        return gpt_oss_targets(block, prefix)
    assert isinstance(block.w13, torch.Tensor) and isinstance(block.w2, torch.Tensor)
    inter, w13, w2 = block.intermediate, block.w13.data, block.w2.data
    if naming == "fused":
        out = {
            f"{prefix}mlp.gate.weight": block.gate.data,
            f"{prefix}mlp.experts.gate_up_proj": w13,
            f"{prefix}mlp.experts.down_proj": w2,
        }
    else:
        mlp, (g, u, d) = (
            ("block_sparse_moe", ("w1", "w3", "w2"))
            if naming == "mixtral"
            else ("mlp", ("gate_proj", "up_proj", "down_proj"))
        )
        out = {f"{prefix}{mlp}.gate.weight": block.gate.data}
        for e in range(block.local.length):
            base = f"{prefix}{mlp}.experts.{block.local.start + e}."
            out[f"{base}{g}.weight"] = w13[e, :inter]
            out[f"{base}{u}.weight"] = w13[e, inter:]
            out[f"{base}{d}.weight"] = w2[e]
    if block.score_bias is not None:
        out[f"{prefix}mlp.gate.e_score_correction_bias"] = block.score_bias.data
    if block.shared_intermediate:
        if naming == "mixtral":
            raise ValueError("Mixtral checkpoints have no shared expert")
        out |= _shared_targets(block, prefix)
    return out


def gpt_oss_targets(block: SparseMoe, prefix: str) -> dict[str, torch.Tensor]:
    """gpt-oss's names: ``mlp.router.weight`` and ``.bias``; ``mlp.experts.gate_up_proj``
    [E, H, 2 I] (gate and up columns interleaved) and ``down_proj`` [E, I, H], transposed
    views of ``w13`` and ``w2``, or packed MXFP4 ``*_blocks`` / ``*_scales`` in ``w13``'s and
    ``w2``'s own orientation; their biases ``*_bias`` [E, 2 I] and [E, H]."""
    p = f"{prefix}mlp."
    out = {f"{p}router.weight": block.gate.data}
    for name, tensor in (
        ("router.bias", block.router_bias),
        ("experts.gate_up_proj_bias", block.w13_bias),
        ("experts.down_proj_bias", block.w2_bias),
    ):
        if tensor is not None:
            out[p + name] = tensor.data
    for name, experts in (("gate_up_proj", block.w13), ("down_proj", block.w2)):
        if isinstance(experts, Mxfp4Experts):
            out |= experts.targets(f"{p}experts.{name}")
        else:
            out[f"{p}experts.{name}"] = experts.data.transpose(1, 2)
    return out


def _shared_targets(block: SparseMoe, prefix: str) -> dict[str, torch.Tensor]:
    """The shared expert's names: Qwen2-MoE's ``mlp.shared_expert.*`` and its gate, or
    DeepSeek's ``mlp.shared_experts.*``."""
    si = block.shared_intermediate
    base = f"{prefix}mlp.shared_expert{'' if block.shared_gate else 's'}."
    out = {
        f"{base}gate_proj.weight": block.shared_gate_up.data[:si],
        f"{base}up_proj.weight": block.shared_gate_up.data[si:],
        f"{base}down_proj.weight": block.shared_down.data,
    }
    if block.shared_gate:
        out[f"{prefix}mlp.shared_expert_gate.weight"] = block.shared_expert_gate.data
    return out


def checkpoint_naming(names: Collection[str], prefix: str, family_naming: str) -> str:
    """``"fused"`` when the checkpoint's tensor ``names`` hold the layer at ``prefix`` in
    transformers 5's fused layout, else ``family_naming`` (gpt-oss has one layout)."""
    fused = family_naming != "gpt_oss" and f"{prefix}mlp.experts.gate_up_proj" in names
    return "fused" if fused else family_naming
