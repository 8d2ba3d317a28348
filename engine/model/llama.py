"""The Llama decoder in plain torch, over the paged KV cache.

A forward takes the flattened tokens of a whole step (prefill chunks and decode tokens mixed)
and returns logits only for the rows that are sampled. Projections are fused at load time:
one ``qkv`` matmul and one ``gate_up`` matmul per layer. The element-wise work between them
runs as torch, C or Triton ops (``engine.model.layer_ops``), chosen once per step.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from engine import cpu_kernels
from engine.model import linear as cpu_linear
from engine.model.attention import AttentionBackend, AttentionMetadata, TritonAttention
from engine.model.config import ModelConfig, RopeScaling
from engine.model.layer_ops import CpuKernelOps, LayerOps, TorchOps, TritonOps


def _weight(*shape: int, dtype: torch.dtype, device: torch.device | str) -> nn.Parameter:
    """Uninitialised frozen weight; the loader fills it."""
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """[head_dim / 2] fp32 inverse frequencies, llama3-scaled when ``scaling`` is given."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    wavelen = 2 * math.pi / inv_freq
    old_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_len / scaling.low_freq_factor
    high_freq_wavelen = old_len / scaling.high_freq_factor
    # long wavelengths are slowed by `factor`, short ones kept, the band between blended
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_band, blended, scaled)


class Rotary(nn.Module):
    """Precomputed cos/sin tables ``[max_len, head_dim / 2]`` (rotate-half convention)."""

    def __init__(
        self, config: ModelConfig, max_len: int, dtype: torch.dtype, device: torch.device | str
    ) -> None:
        super().__init__()
        inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer("cos", freqs.cos().to(device, dtype), persistent=False)
        self.register_buffer("sin", freqs.sin().to(device, dtype), persistent=False)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for ``positions`` [tokens]: each [tokens, 1, head_dim / 2]."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


_LINEAR_WEIGHTS = ("qkv", "o_proj", "gate_up", "down")


class DecoderLayer(nn.Module):
    def __init__(
        self, config: ModelConfig, index: int, dtype: torch.dtype, device: torch.device | str
    ) -> None:
        super().__init__()
        hidden, inter = config.hidden_size, config.intermediate_size
        self.index = index
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.eps = config.rms_norm_eps
        self.input_norm = _weight(hidden, dtype=dtype, device=device)
        self.qkv = _weight(config.q_size + 2 * config.kv_size, hidden, dtype=dtype, device=device)
        self.o_proj = _weight(hidden, config.q_size, dtype=dtype, device=device)
        self.post_norm = _weight(hidden, dtype=dtype, device=device)
        self.gate_up = _weight(2 * inter, hidden, dtype=dtype, device=device)
        self.down = _weight(hidden, inter, dtype=dtype, device=device)
        # Weight name -> packed copy (CPU fp32, see engine.model.linear); empty if off.
        self.packed: dict[str, torch.Tensor] = {}

    def pack_cpu_weights(self) -> None:
        packed = {n: cpu_linear.pack(getattr(self, n)) for n in _LINEAR_WEIGHTS}
        self.packed = {n: p for n, p in packed.items() if p is not None}

    def forward(
        self,
        h: torch.Tensor,
        ops: LayerOps,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        attention: AttentionBackend,
    ) -> torch.Tensor:
        """h: [tokens, hidden] -> [tokens, hidden], the residual stream, updated in place."""
        tokens, packed = h.shape[0], self.packed
        x = ops.norm(h, self.input_norm, self.eps)
        qkv = cpu_linear.linear(x, self.qkv, packed.get("qkv"))  # [tokens, (h + 2 kvh) * d]
        q, k, v = ops.rope_write_kv(
            qkv, self.num_heads, self.num_kv_heads, kv_cache, self.index, meta
        )
        o = attention(q, k, v, kv_cache, self.index, meta)  # [tokens, heads, d]
        h = cpu_linear.add_linear_(h, o.reshape(tokens, -1), self.o_proj, packed.get("o_proj"))
        x = ops.norm(h, self.post_norm, self.eps)
        gate_up = cpu_linear.linear(x, self.gate_up, packed.get("gate_up"))
        return cpu_linear.add_linear_(h, ops.silu_mul(gate_up), self.down, packed.get("down"))


class LlamaModel(nn.Module):
    """Llama-family causal LM. Weights are empty until ``engine.model.loader.load_weights``."""

    def __init__(
        self,
        config: ModelConfig,
        attention: AttentionBackend,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        super().__init__()
        self.config = config
        self.attention = attention
        vocab, hidden = config.vocab_size, config.hidden_size
        self.embed = _weight(vocab, hidden, dtype=dtype, device=device)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, dtype, device) for i in range(config.num_hidden_layers)
        )
        self.norm = _weight(hidden, dtype=dtype, device=device)
        self.lm_head = (
            self.embed
            if config.tie_word_embeddings
            else _weight(vocab, hidden, dtype=dtype, device=device)
        )
        self.rotary = Rotary(config, max_len, dtype, device)
        self.packed_lm_head: torch.Tensor | None = None
        self.cpu_kernels = False  # see use_cpu_kernels
        cos, sin = self.rotary.cos, self.rotary.sin
        self.cpu_ops = CpuKernelOps(cos, sin)
        # The Triton attention backend runs where the Triton kernels do: the fused ops too.
        self.triton_ops = TritonOps(cos, sin) if isinstance(attention, TritonAttention) else None

    def _on_cpu_fp32(self) -> bool:
        return self.embed.device.type == "cpu" and self.embed.dtype == torch.float32

    def use_cpu_kernels(self, enable: bool = True) -> bool:
        """Run RMSNorm, rotary + KV write and SiLU * up as C kernels where a step allows it
        (CPU fp32 with the kernels built); returns whether they are on."""
        self.cpu_kernels = enable and self._on_cpu_fp32() and cpu_kernels.available()
        return self.cpu_kernels

    def pack_cpu_weights(self) -> bool:
        """Pack the linear weights for the CPU kernel (after loading); False where this
        model cannot (not CPU fp32, or no kernels built here)."""
        if not self._on_cpu_fp32() or not cpu_kernels.available():
            return False
        for layer in self.decoder_layers():
            layer.pack_cpu_weights()
        self.packed_lm_head = cpu_linear.pack(self.lm_head)
        return True

    def step_ops(
        self, h: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata
    ) -> LayerOps:
        """The layers' element-wise ops for a step: Triton with the Triton backend, the C
        kernels where they are on and take the tensors, else torch."""
        if self.triton_ops is not None:
            return self.triton_ops
        if self.cpu_kernels and cpu_kernels.fused_ops_supported(h, kv_cache):
            return self.cpu_ops
        return TorchOps(*self.rotary.tables(meta.positions))

    def decoder_layers(self) -> list[DecoderLayer]:
        return [cast(DecoderLayer, layer) for layer in self.layers]

    def forward(
        self,
        input_ids: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: torch.Tensor,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """input_ids: [tokens]; logits_indices: [sampled] rows of the step to score.

        Writes the step's K/V into ``kv_cache``; returns logits [sampled, vocab] in the
        model dtype.
        """
        h = F.embedding(input_ids, self.embed)  # [tokens, hidden]
        ops = self.step_ops(h, kv_cache, meta)
        for layer in self.layers:
            h = layer(h, ops, kv_cache, meta, self.attention)
        last = ops.norm(h[logits_indices], self.norm, self.config.rms_norm_eps)
        return cpu_linear.linear(last, self.lm_head, self.packed_lm_head)  # [sampled, vocab]
