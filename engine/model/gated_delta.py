"""Gated DeltaNet (Qwen3-Next's linear attention), the layer object that stands in for
``SelfAttention`` on a family's linear-attention layers.

``in_proj_qkvz`` and ``in_proj_ba`` (fused here into one ``in_proj``) give, per key-head
group, q, k, v and the output gate z, and each value head's beta and decay input; q, k and
v go through a causal depthwise conv (its last inputs kept per request) and SiLU; q and k
are l2-normed; the recurrence (``engine.model.delta_rule``) runs over a per-request state;
its output is RMS-normed, gated by silu(z) and projected back (``o_proj``, the checkpoint's
``out_proj``). Nothing goes to the paged KV cache: the states live in the step's
``AttentionMetadata.states``, which also names the checkpoints a chunk starts from or saves
(``engine.kv.state_checkpoints``).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F

from engine.model.attention import AttentionBackend, AttentionMetadata, LinearStates
from engine.model.config import ModelConfig
from engine.model.delta_rule import (
    DeltaInputs,
    conv_chunk,
    conv_decodes,
    gated_norm,
    l2norm,
    recur,
    step,
)
from engine.model.layer_ops import LayerOps
from engine.model.layers import Packed, weight


class GatedDeltaNet(Packed):
    """The linear-attention layer over the step's per-request states."""

    MATRICES = ("in_proj", "o_proj")

    def __init__(
        self,
        config: ModelConfig,
        index: int,
        dtype: torch.dtype,
        device: torch.device | str,
        state_index: int,
    ) -> None:
        """``state_index``: the layer's place among the linear layers (in the state pool)."""
        super().__init__()
        spec = config.linear
        assert spec is not None
        self.spec, self.eps, self.index = spec, config.rms_norm_eps, state_index
        self.rope_index, self.o_bias = 0, None
        hidden = config.hidden_size
        self.qkvz_rows = 2 * spec.key_dim + 2 * spec.value_dim
        self.in_proj = weight(
            self.qkvz_rows + 2 * spec.num_v_heads, hidden, dtype=dtype, device=device
        )
        self.conv = weight(spec.conv_dim, spec.conv_kernel, dtype=dtype, device=device)
        self.dt_bias = weight(spec.num_v_heads, dtype=dtype, device=device)
        self.a_log = weight(spec.num_v_heads, dtype=dtype, device=device)
        self.norm = weight(spec.v_head_dim, dtype=dtype, device=device)
        self.o_proj = weight(hidden, spec.value_dim, dtype=dtype, device=device)

    def attend(
        self,
        x: torch.Tensor,
        ops: LayerOps,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        attention: AttentionBackend,
    ) -> torch.Tensor:
        """x: [tokens, hidden] (normed) -> [tokens, value_dim], the output projection's
        input; each sequence's states advance past its tokens."""
        spec, tokens = self.spec, x.shape[0]
        states = meta.states or self._scratch(len(meta.query_lens), x.device)
        mixed, z, b, a = self._project(x)
        conv = self._conv(mixed, meta, states)  # [tokens, conv_dim]
        q, k, v = conv.split((spec.key_dim, spec.key_dim, spec.value_dim), dim=-1)
        ratio = spec.num_v_heads // spec.num_k_heads
        q = l2norm(q.float().view(tokens, spec.num_k_heads, -1)) * spec.k_head_dim**-0.5
        k = l2norm(k.float().view(tokens, spec.num_k_heads, -1))
        g = -self.a_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        inputs = DeltaInputs(
            q.repeat_interleave(ratio, dim=1),
            k.repeat_interleave(ratio, dim=1),
            v.float().view(tokens, spec.num_v_heads, -1),
            g,
            b.float().sigmoid(),
        )
        o = self._recur(inputs, meta, states)  # [tokens, v_heads, v_dim] fp32
        return gated_norm(o.to(x.dtype), z, self.norm, self.eps).reshape(tokens, -1)

    def _project(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q | k | v [tokens, conv_dim], z [tokens, v_heads, v_dim], b and a [tokens,
        v_heads]) from the checkpoint's grouped layout: per key head, its q, k, then its
        value heads' v and z; then per key head its value heads' b, then their a."""
        spec, tokens = self.spec, x.shape[0]
        proj = self.project(x, "in_proj", None)
        groups = proj[:, : self.qkvz_rows].view(tokens, spec.num_k_heads, -1)
        vz = groups.shape[-1] - 2 * spec.k_head_dim
        q, k, v, z = groups.split((spec.k_head_dim, spec.k_head_dim, vz // 2, vz // 2), dim=-1)
        ba = proj[:, self.qkvz_rows :].view(tokens, spec.num_k_heads, 2, -1)
        mixed = torch.cat((q.flatten(1), k.flatten(1), v.flatten(1)), dim=-1)
        b, a = ba[:, :, 0].flatten(1), ba[:, :, 1].flatten(1)
        return mixed, z.reshape(tokens, spec.num_v_heads, -1), b, a

    def _conv(
        self, mixed: torch.Tensor, meta: AttentionMetadata, states: LinearStates
    ) -> torch.Tensor:
        out = torch.empty_like(mixed)
        d, conv = meta.num_decodes, states.conv[:, self.index]  # [slots, conv_dim, k - 1]
        saved = states.checkpoints.conv[:, self.index] if states.checkpoints else None
        if d:
            slots = torch.tensor(states.slots[:d], device=mixed.device)
            rows = _started(conv.index_select(0, slots), states, saved)
            out[:d] = conv_decodes(mixed[:d], rows, self.conv)
            conv.index_copy_(0, slots, rows)
            _save_rows(rows, states, saved)
        for state, start, end in _pieces(meta, states, conv, saved):
            out[start:end] = conv_chunk(mixed[start:end], state, self.conv)
        return out

    def _recur(
        self, inputs: DeltaInputs, meta: AttentionMetadata, states: LinearStates
    ) -> torch.Tensor:
        out = torch.empty_like(inputs.v)
        d, rec = meta.num_decodes, states.recurrent[:, self.index]
        saved = states.checkpoints.recurrent[:, self.index] if states.checkpoints else None
        if d:
            slots = torch.tensor(states.slots[:d], device=out.device)
            s = _started(rec.index_select(0, slots), states, saved)
            s = step(s, *DeltaInputs(*(t[:d] for t in inputs)), out[:d])
            rec.index_copy_(0, slots, s)
            _save_rows(s, states, saved)
        for state, start, end in _pieces(meta, states, rec, saved):
            out[start:end] = recur(DeltaInputs(*(t[start:end] for t in inputs)), state)
        return out

    def _scratch(self, seqs: int, device: torch.device) -> LinearStates:
        """Zero states for a forward that keeps none (the memory profile's)."""
        spec, layers = self.spec, self.index + 1
        conv = torch.zeros(
            seqs, layers, *spec.conv_state_shape, dtype=self.conv.dtype, device=device
        )
        rec = torch.zeros(seqs, layers, *spec.recurrent_shape, device=device)
        return LinearStates(conv, rec, tuple(range(seqs)), (True,) * seqs)

    def norm_weights(self) -> list[torch.Tensor]:
        return []  # the gated norm scales by w itself, not (1 + w)

    def weight_targets(self, prefix: str) -> dict[str, torch.Tensor]:
        p, rows = prefix + "linear_attn.", self.qkvz_rows
        return {
            p + "in_proj_qkvz.weight": self.in_proj.data[:rows],
            p + "in_proj_ba.weight": self.in_proj.data[rows:],
            p + "conv1d.weight": self.conv.data.unsqueeze(1),
            p + "dt_bias": self.dt_bias.data,
            p + "A_log": self.a_log.data,
            p + "norm.weight": self.norm.data,
            p + "out_proj.weight": self.o_proj.data,
        }


def _started(rows: torch.Tensor, states: LinearStates, saved: torch.Tensor | None) -> torch.Tensor:
    """rows [d, ...]: the one-token sequences' gathered states (decodes, and prefill chunks
    of one token), zeroed where a sequence starts fresh, a checkpoint's where it starts
    from one."""
    fresh = states.fresh[: rows.shape[0]]
    if any(fresh):
        rows[torch.tensor(fresh, device=rows.device)] = 0
    for i in range(rows.shape[0]):
        load = states.load(i)
        if load is not None:
            assert saved is not None
            rows[i] = saved[load]
    return rows


def _save_rows(rows: torch.Tensor, states: LinearStates, saved: torch.Tensor | None) -> None:
    """The one-token sequences' states after their token into the checkpoints they save."""
    if not states.saves:
        return
    for i in range(rows.shape[0]):
        for _, slot in states.saves_of(i):  # a one-token chunk saves after its token
            assert saved is not None
            saved[slot] = rows[i]


def _pieces(
    meta: AttentionMetadata,
    states: LinearStates,
    pool: torch.Tensor,
    saved: torch.Tensor | None,
) -> Iterator[tuple[torch.Tensor, int, int]]:
    """(state, first token, end) of each piece of the step's prefill chunks, in order, for
    one layer (``pool``: its slots' states, ``saved``: its checkpoints'). A chunk's state
    starts from zeros, from a checkpoint (a prefix-cache hit) or as its previous chunk left
    it; the chunk is cut where it saves a checkpoint, the state copied there once the
    piece before has run."""
    for i, start, end in _chunks(meta):
        state, load = pool[states.slots[i]], states.load(i)
        if load is not None:
            assert saved is not None
            state.copy_(saved[load])
        elif states.fresh[i]:
            state.zero_()
        at = start
        for offset, slot in states.saves_of(i):
            assert saved is not None
            if start + offset > at:
                yield state, at, start + offset
                at = start + offset
            saved[slot].copy_(state)
        if end > at:
            yield state, at, end


def _chunks(meta: AttentionMetadata) -> list[tuple[int, int, int]]:
    """(sequence, first token, end) of each prefill chunk of the step."""
    out, start = [], meta.num_decodes
    for i in range(meta.num_decodes, len(meta.query_lens)):
        end = start + meta.query_lens[i]
        out.append((i, start, end))
        start = end
    return out
