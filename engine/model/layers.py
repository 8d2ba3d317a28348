"""The layer objects a decoder is composed of: self-attention and the gated MLP.

Each object owns its weights (fused at load: one ``qkv`` and one ``gate_up`` matmul), the
options its family sets (q/k/v and output biases, per-head q/k norms, a sliding window,
soft-capping, attention sinks, the MLP's activation), the checkpoint names that fill them
and their packed CPU copies. The element-wise work runs as torch, C or Triton ops
(``engine.model.layer_ops``) chosen once per step; the objects never branch on the backend.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from engine.model import linear as cpu_linear
from engine.model.attention import AttentionBackend, AttentionMetadata, AttentionSpec
from engine.model.config import ModelConfig
from engine.model.layer_ops import LayerOps
from engine.model.quant.weight import PackedMatrix
from engine.model.rope import partial_rotary_order


def weight(*shape: int, dtype: torch.dtype, device: torch.device | str) -> nn.Parameter:
    """Uninitialised frozen weight; the loader fills it."""
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


def optional_weight(
    present: bool, *shape: int, dtype: torch.dtype, device: torch.device | str
) -> nn.Parameter | None:
    return weight(*shape, dtype=dtype, device=device) if present else None


class DeltaHook(Protocol):
    """Adds a per-row delta to a projection's output (LoRA: ``engine.lora.delta``)."""

    def add_(self, out: torch.Tensor, x: torch.Tensor, name: str) -> None: ...


class Packed(nn.Module):
    """A module whose matrices the CPU kernel reads from packed copies (after loading)."""

    MATRICES: tuple[str, ...] = ()

    def __init__(self) -> None:
        super().__init__()
        # weight name -> packed copy (empty if off), or the quantized weight (always used)
        self.packed: dict[str, torch.Tensor | PackedMatrix] = {}
        self.lora: DeltaHook | None = None  # set by engine.lora when adapters are enabled

    def pack_cpu_weights(self) -> None:
        packed = {
            n: cpu_linear.pack(getattr(self, n)) for n in self.MATRICES if n not in self.packed
        }
        self.packed |= {n: p for n, p in packed.items() if p is not None}

    def project(self, x: torch.Tensor, name: str, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W.T (+ bias)`` for the matrix ``name``."""
        out = cpu_linear.linear(x, getattr(self, name), self.packed.get(name))
        if self.lora is not None:
            self.lora.add_(out, x, name)
        return out if bias is None else out.add_(bias)

    def add_project_(
        self, h: torch.Tensor, x: torch.Tensor, name: str, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """``h += x @ W.T (+ bias)`` in place (the GEMM adds into the residual)."""
        h = cpu_linear.add_linear_(h, x, getattr(self, name), self.packed.get(name))
        if self.lora is not None:
            self.lora.add_(h, x, name)
        return h if bias is None else h.add_(bias)


class SelfAttention(Packed):
    """Grouped-query self-attention over the paged cache, with the family's options."""

    MATRICES = ("qkv", "o_proj")

    def __init__(
        self,
        config: ModelConfig,
        index: int,
        dtype: torch.dtype,
        device: torch.device | str,
        cache_index: int | None = None,
    ) -> None:
        """``index``: the model's layer; ``cache_index``: its layer in the KV cache, where
        the cache holds only some layers (a pipeline stage's); default ``index``."""
        super().__init__()
        q, kv, hidden, d = config.q_size, config.kv_size, config.hidden_size, config.head_dim
        self.index = index if cache_index is None else cache_index
        self.q_size, self.kv_size = q, kv
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.eps = config.rms_norm_eps
        self.naming = config.naming
        heads = self.num_heads
        self.sinks = optional_weight(config.attention_sinks, heads, dtype=dtype, device=device)
        self.spec = AttentionSpec(
            scale=config.attention_scale,
            window=config.layer_windows[index],
            softcap=config.attn_softcap,
            sinks=self.sinks,
        )
        self.rope_index = config.rope_table(index)  # see DecoderModel.rotaries
        self.rope_order = _rope_order(config, device)
        self.qkv = weight(q + 2 * kv, hidden, dtype=dtype, device=device)
        self.qkv_bias = optional_weight(config.qkv_bias, q + 2 * kv, dtype=dtype, device=device)
        self.o_proj = weight(hidden, q, dtype=dtype, device=device)
        self.o_bias = optional_weight(config.o_bias, hidden, dtype=dtype, device=device)
        self.q_norm = optional_weight(config.qk_norm, d, dtype=dtype, device=device)
        self.k_norm = optional_weight(config.qk_norm, d, dtype=dtype, device=device)

    def attend(
        self,
        x: torch.Tensor,
        ops: LayerOps,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        attention: AttentionBackend,
    ) -> torch.Tensor:
        """x: [tokens, hidden] (normed) -> [tokens, heads * d], the output projection's
        input; this step's K and V are stored in the cache on the way."""
        qkv = self.project(x, "qkv", self.qkv_bias)  # [tokens, (h + 2 kvh) * d]
        if self.q_norm is not None and self.k_norm is not None:
            q_end, k_end = self.q_size, self.q_size + self.kv_size
            ops.head_norm_(qkv[:, :q_end], self.num_heads, self.q_norm, self.eps)
            ops.head_norm_(qkv[:, q_end:k_end], self.num_kv_heads, self.k_norm, self.eps)
        if self.rope_order is not None:  # a partial rotary's pairs moved to whole-head's
            qkv = qkv.index_select(1, self.rope_order)
        q, k, v = ops.rope_write_kv(
            qkv, self.num_heads, self.num_kv_heads, kv_cache, self.index, meta
        )
        o = attention(q, k, v, kv_cache, self.index, meta, self.spec)  # [tokens, heads, d]
        return o.reshape(x.shape[0], -1)

    def norm_weights(self) -> list[torch.Tensor]:
        return [n.data for n in (self.q_norm, self.k_norm) if n is not None]

    def weight_targets(self, prefix: str) -> dict[str, torch.Tensor]:
        q, kv, p = self.qkv.shape[0] - 2 * self.kv_size, self.kv_size, prefix + "self_attn."
        if self.naming == "phi3":
            targets = {p + "qkv_proj.weight": self.qkv.data}
        else:
            targets = _split_rows(p, "weight", self.qkv.data, q, kv)
            if self.qkv_bias is not None:
                targets |= _split_rows(p, "bias", self.qkv_bias.data, q, kv)
        targets[p + "o_proj.weight"] = self.o_proj.data
        for name, tensor in (
            ("o_proj.bias", self.o_bias),
            ("q_norm.weight", self.q_norm),
            ("k_norm.weight", self.k_norm),
            ("sinks", self.sinks),
        ):
            if tensor is not None:
                targets[p + name] = tensor.data
        return targets


def _rope_order(config: ModelConfig, device: torch.device | str) -> torch.Tensor | None:
    """[q + 2 kv] int64: the fused qkv columns in the order a partial rotary's kernels read
    (``partial_rotary_order`` in each q and k head, v as it is), or None for a whole-head
    rotary."""
    if not config.partial_rotary:
        return None
    d, heads = config.head_dim, config.num_attention_heads + config.num_key_value_heads
    head = partial_rotary_order(d, config.rope_dims)  # [d]
    qk = (torch.arange(heads).unsqueeze(1) * d + head).reshape(-1)  # [(h + kvh) * d]
    v = torch.arange(heads * d, heads * d + config.kv_size)
    return torch.cat([qk, v]).to(device)


def _split_rows(p: str, kind: str, fused: torch.Tensor, q: int, kv: int) -> dict[str, torch.Tensor]:
    return {
        f"{p}q_proj.{kind}": fused[:q],
        f"{p}k_proj.{kind}": fused[q : q + kv],
        f"{p}v_proj.{kind}": fused[q + kv :],
    }


class GatedMlp(Packed):
    """``down(act(gate(x)) * up(x))``, gate and up fused into one matmul."""

    MATRICES = ("gate_up", "down")

    def __init__(
        self,
        hidden: int,
        inter: int,
        activation: str,
        naming: str,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        super().__init__()
        self.activation = activation
        self.naming = naming
        self.gate_up = weight(2 * inter, hidden, dtype=dtype, device=device)
        self.down = weight(hidden, inter, dtype=dtype, device=device)

    def hidden_act(self, x: torch.Tensor, ops: LayerOps) -> torch.Tensor:
        """x: [tokens, hidden] (normed) -> [tokens, inter], the down projection's input."""
        if self.activation == "silu" and self.lora is None:
            fused = cpu_linear.silu_mul_linear(x, self.packed.get("gate_up"))
            if fused is not None:
                return fused
        return ops.act_mul(self.project(x, "gate_up", None), self.activation)

    def weight_targets(self, prefix: str) -> dict[str, torch.Tensor]:
        p, inter = prefix + "mlp.", self.down.shape[1]
        if self.naming == "phi3":
            targets = {p + "gate_up_proj.weight": self.gate_up.data}
        else:
            targets = {
                p + "gate_proj.weight": self.gate_up.data[:inter],
                p + "up_proj.weight": self.gate_up.data[inter:],
            }
        return targets | {p + "down_proj.weight": self.down.data}
