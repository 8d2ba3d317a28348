"""Read a rank's slice of each checkpoint tensor, never the whole of a split one.

The rule is by tensor name (the names the layers' ``weight_targets`` use): query / KV rows
of ``q_proj``, ``k_proj``, ``v_proj`` (and the three parts of Phi-3's fused ``qkv_proj``),
the query heads' attention sinks,
the matching columns of ``o_proj`` (Gated DeltaNet: the rank's key-head groups of
``in_proj_qkvz`` / ``in_proj_ba``, their conv channels, decay and bias entries and columns of
``out_proj``; MLA: the query heads' rows of ``q_proj`` / ``q_b_proj``
and ``kv_b_proj``, the latent's projections whole); MLP rows of ``gate_proj`` / ``up_proj``
(Phi-3's fused ``gate_up_proj``) and columns of ``down_proj``, the shared experts'
likewise; the experts this rank holds (others are not read); vocabulary rows of the
embedding and the head, padded to the rank's row count. Everything else (norms, biases
added after the sum, routers) is read whole: replicated.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import torch

from engine.model.shard import Shard, Span, experts

_EXPERT = re.compile(r"\.experts\.(\d+)\.")
# the fused tensors whose first dim is the expert (transformers 5's layout, gpt-oss's)
EXPERT_TENSORS = tuple(
    f"mlp.experts.{name}{suffix}"
    for name in ("gate_up_proj", "down_proj")
    for suffix in ("", "_bias", "_blocks", "_scales")
)


class Piece(NamedTuple):
    dim: int  # 0: rows, 1: columns
    span: Span


class Plan(NamedTuple):
    """How to read one tensor on this rank: the pieces (concatenated along their dim), the
    row count to zero-pad to (0: none), or skip it (another rank's expert)."""

    pieces: tuple[Piece, ...] = ()
    pad_rows: int = 0
    skip: bool = False


WHOLE = Plan()


def plan(name: str, config: Any, shard: Shard) -> Plan:
    """The read plan of tensor ``name`` for ``shard`` of a model of ``config`` (the whole
    model's ModelConfig)."""
    if shard.size == 1:
        return WHOLE
    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
        rows = shard.vocab(config.vocab_size)
        return Plan((Piece(0, rows),), shard.vocab_rows(config.vocab_size))
    if "self_attn." in name:
        return _attention(name, config, shard)
    if "linear_attn." in name:
        return _linear_attention(name, config.linear, shard)
    if config.moe is not None:
        moe = _moe(name, config, shard)
        if moe is not None:
            return moe
    inter = shard.part(config.intermediate_size, "intermediate_size")
    return _mlp(name, "mlp.", inter, config.intermediate_size)


def _attention(name: str, config: Any, shard: Shard) -> Plan:
    if config.mla is not None:
        return _latent_attention(name, config, shard)
    d = config.head_dim
    q, kv = shard.heads(config.num_attention_heads, config.num_key_value_heads)
    q_rows, kv_rows = Span(q.start * d, q.length * d), Span(kv.start * d, kv.length * d)
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        per = 2 * d if config.attn_output_gate else d  # Qwen3-Next: a query and a gate a head
        return Plan((Piece(0, Span(q.start * per, q.length * per)),))
    if name.endswith(("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias")):
        return Plan((Piece(0, kv_rows),))
    if name.endswith("qkv_proj.weight"):
        q_all, kv_all = config.q_size, config.kv_size
        k_part = Span(q_all + kv_rows.start, kv_rows.length)
        v_part = Span(q_all + kv_all + kv_rows.start, kv_rows.length)
        return Plan((Piece(0, q_rows), Piece(0, k_part), Piece(0, v_part)))
    if name.endswith("o_proj.weight"):
        return Plan((Piece(1, q_rows),))
    if name.endswith("self_attn.sinks"):
        return Plan((Piece(0, q),))
    return WHOLE


def _latent_attention(name: str, config: Any, shard: Shard) -> Plan:
    """MLA: the rank's query heads' rows of ``q_proj`` / ``q_b_proj`` and ``kv_b_proj``,
    their columns of ``o_proj``; the latent's projections (``q_a``, ``kv_a``) whole."""
    mla = config.mla
    q = shard.heads(config.num_attention_heads, 1)[0]

    def rows(per_head: int) -> Span:
        return Span(q.start * per_head, q.length * per_head)

    if name.endswith(("q_proj.weight", "q_b_proj.weight")):
        return Plan((Piece(0, rows(mla.qk_head_dim)),))
    if name.endswith("kv_b_proj.weight"):
        return Plan((Piece(0, rows(mla.qk_nope_head_dim + mla.v_head_dim)),))
    if name.endswith("o_proj.weight"):
        return Plan((Piece(1, rows(mla.v_head_dim)),))
    return WHOLE


def _linear_attention(name: str, spec: Any, shard: Shard) -> Plan:
    """Gated DeltaNet: the rank's key heads and their value heads. ``in_proj_qkvz`` and
    ``in_proj_ba`` group rows by key head; the conv's channels are q, k, then v."""
    k = shard.linear_heads(spec.num_k_heads)
    ratio = spec.num_v_heads // spec.num_k_heads
    v = Span(k.start * ratio, k.length * ratio)

    def rows(span: Span, per: int, offset: int = 0) -> Piece:
        return Piece(0, Span(offset + span.start * per, span.length * per))

    kd, vd = spec.k_head_dim, spec.v_head_dim
    if name.endswith("in_proj_qkvz.weight"):
        return Plan((rows(k, 2 * kd + 2 * ratio * vd),))
    if name.endswith("in_proj_ba.weight"):
        return Plan((rows(k, 2 * ratio),))
    if name.endswith("conv1d.weight"):
        return Plan((rows(k, kd), rows(k, kd, spec.key_dim), rows(v, vd, 2 * spec.key_dim)))
    if name.endswith(("dt_bias", "A_log")):
        return Plan((rows(v, 1),))
    if name.endswith("out_proj.weight"):
        return Plan((Piece(1, Span(v.start * vd, v.length * vd)),))
    return WHOLE


def _moe(name: str, config: Any, shard: Shard) -> Plan | None:
    """The plan of an expert tensor; None for the names of a dense layer."""
    mine = experts(shard, config.moe.num_experts)
    match = _EXPERT.search(name)
    if match is not None:
        return WHOLE if mine.start <= int(match.group(1)) < mine.stop else Plan(skip=True)
    if name.endswith(EXPERT_TENSORS):
        return Plan((Piece(0, mine),))
    shared = config.moe.shared_intermediate_size
    prefix = next((p for p in ("mlp.shared_expert.", "mlp.shared_experts.") if p in name), None)
    if prefix is not None:
        part = shard.part(shared, "shared_expert_intermediate_size")
        return _mlp(name, prefix, part, shared)
    return None


def _mlp(name: str, prefix: str, part: Span, inter: int) -> Plan:
    if name.endswith((prefix + "gate_proj.weight", prefix + "up_proj.weight")):
        return Plan((Piece(0, part),))
    if name.endswith(prefix + "gate_up_proj.weight"):
        return Plan((Piece(0, part), Piece(0, Span(inter + part.start, part.length))))
    if name.endswith(prefix + "down_proj.weight"):
        return Plan((Piece(1, part),))
    return WHOLE


def read(
    handle: Any, name: str, config: Any, shard: Shard, key: str | None = None
) -> torch.Tensor | None:
    """This rank's part of tensor ``name`` (stored as ``key``, default ``name``) from an
    open safetensors ``handle``; None when the rank holds none of it."""
    how = plan(name, config, shard)
    key = name if key is None else key
    if how.skip:
        return None
    if not how.pieces:
        return handle.get_tensor(key)
    whole = handle.get_slice(key)
    parts = [
        whole[p.span.start : p.span.stop] if p.dim == 0 else whole[:, p.span.start : p.span.stop]
        for p in how.pieces
    ]
    tensor = parts[0] if len(parts) == 1 else torch.cat(parts, dim=how.pieces[0].dim)
    if how.pad_rows > tensor.shape[0]:
        pad = tensor.new_zeros(how.pad_rows - tensor.shape[0], *tensor.shape[1:])
        tensor = torch.cat([tensor, pad])
    return tensor
