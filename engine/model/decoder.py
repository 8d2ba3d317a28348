"""The decoder every family composes, in plain torch over the paged KV cache.

A forward takes the flattened tokens of a whole step (prefill chunks and decode tokens mixed)
and returns logits only for the rows that are sampled. A layer is a norm, self-attention
(``engine.model.layers.SelfAttention``), a norm and an MLP: the gated one, or mixture of
experts (``engine.model.moe.SparseMoe``) on a family's sparse layers; Gemma's families add
a norm after each (sandwich norms). The residual adds stay in the matmuls where no norm
comes between (``h.addmm_``).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import cast

import torch
from torch import nn

from engine import cpu_kernels
from engine.model import linear as cpu_linear
from engine.model.attention import AttentionBackend, AttentionMetadata, TritonAttention
from engine.model.config import ModelConfig
from engine.model.decoder_layer import DecoderLayer
from engine.model.layer_ops import CpuKernelOps, LayerOps, TorchOps, TritonOps
from engine.model.layers import Packed, weight
from engine.model.moe import expert_weight_bytes
from engine.model.quant.weight import PackedMatrix, QuantWeight
from engine.model.rope import Rotary
from engine.model.shard import Shard, shard_config
from engine.model.stage import Stage


class DecoderModel(nn.Module):
    """A causal LM of any family. Weights are empty until ``engine.model.loader``'s
    ``load_weights`` (or ``init_random_weights``) fills them. With a ``shard`` of a
    tensor-parallel group it holds that rank's part (``engine.model.shard``); with a
    pipeline ``stage``, that stage's layers, its ends' embedding or head
    (``engine.model.stage``; the tensors it lacks are empty); ``config`` stays the whole
    model's."""

    def __init__(
        self,
        config: ModelConfig,
        attention: AttentionBackend,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
        shard: Shard | None = None,
        stage: Stage | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.shard = shard = shard or Shard()
        self.stage = stage = stage or Stage.whole(config.num_hidden_layers)
        self.attention = attention
        vocab, hidden = shard.vocab_rows(config.vocab_size), config.hidden_size
        tied = config.tie_word_embeddings
        rows = vocab if stage.has_embedding(tied) else 0
        self.embed = weight(rows, hidden, dtype=dtype, device=device)
        local = shard_config(config, shard)
        first = stage.layers.start
        self.layers = nn.ModuleList(
            DecoderLayer(local, i, dtype, device, shard, i - first)
            for i in range(first, stage.layers.stop)
        )
        self.norm = weight(hidden if stage.last else 0, dtype=dtype, device=device)
        self.lm_head = (
            self.embed
            if tied
            else weight(vocab if stage.last else 0, hidden, dtype=dtype, device=device)
        )
        self.rotaries = nn.ModuleList(
            Rotary(config.rotary_dim, rope, max_len, dtype, device, turned)
            for rope, turned in config.rope_tables()
        )
        self.packed_lm_head: cpu_linear.Packed | None = None
        self.packed_embed: QuantWeight | None = None  # a quantized table (engine.model.quant)
        self.cpu_kernels = False  # see use_cpu_kernels
        tables = [(cast(Rotary, r).cos, cast(Rotary, r).sin) for r in self.rotaries]
        self.cpu_ops: list[LayerOps] = [CpuKernelOps(cos, sin) for cos, sin in tables]
        # The Triton attention backend runs where the Triton kernels do: the fused ops too.
        self.triton_ops: list[LayerOps] | None = (
            [TritonOps(cos, sin) for cos, sin in tables]
            if isinstance(attention, TritonAttention)
            else None
        )

    def _on_cpu_fp32(self) -> bool:
        return self.norm.device.type == "cpu" and self.norm.dtype == torch.float32

    def use_cpu_kernels(self, enable: bool = True) -> bool:
        """Run RMSNorm, rotary + KV write and SiLU * up as C kernels where a step allows it
        (CPU fp32 with the kernels built); returns whether they are on."""
        self.cpu_kernels = enable and self._on_cpu_fp32() and cpu_kernels.available()
        return self.cpu_kernels

    def use_bf16_products(self, enable: bool) -> int:
        """Let the decoder layers' packed products run in bf16 (``QuantWeight.bf16_products``:
        float32_matmul_precision "medium"), and the CPU backend's prefill attention of whole
        prompts with them; the lm_head and the embedding stay as they are.
        Returns how many weights take bf16 products here (the AMX kernel built and allowed)."""
        heads = {id(self.packed_embed), id(self.packed_lm_head)}
        layers = [w for w in self.quantized_weights() if id(w) not in heads]
        on = [w for w in layers if isinstance(w, QuantWeight) and w.allow_bf16_products(enable)]
        if hasattr(self.attention, "bf16_prefill"):  # the CPU backend's prefill on AMX tiles
            self.attention.bf16_prefill = enable and bool(on)
        return len(on)

    def use_int8_activations(self, enable: bool) -> int:
        """Let every packed weight (the decoder layers' and a packed lm_head) compute its
        products on integer dots (``EngineConfig.int8_activations``); returns how many do (0
        where the build has no such kernel)."""
        weights = [w for w in self.quantized_weights() if isinstance(w, QuantWeight)]
        return sum(w.use_int8_activations(enable) for w in weights)

    def pack_cpu_weights(self) -> bool:
        """Pack the linear weights for the CPU kernel (after loading); False where this
        model cannot (not CPU fp32, or no kernels built here)."""
        if not self._on_cpu_fp32() or not cpu_kernels.available():
            return False
        for layer in self.decoder_layers():
            layer.pack_cpu_weights()
        if self.packed_lm_head is None and self.stage.last:
            self.packed_lm_head = cpu_linear.pack(self.lm_head)
        return True

    def step_ops(
        self, h: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata
    ) -> list[LayerOps]:
        """The layers' element-wise ops for a step, one per rotary table: Triton with the
        Triton backend, the C kernels where they are on and take the tensors, else torch."""
        if self.triton_ops is not None:
            return self.triton_ops
        if self.cpu_kernels and cpu_kernels.fused_ops_supported(h, kv_cache):
            return self.cpu_ops
        return [TorchOps(*cast(Rotary, r).tables(meta.positions)) for r in self.rotaries]

    def decoder_layers(self) -> list[DecoderLayer]:
        return [cast(DecoderLayer, layer) for layer in self.layers]

    def weight_targets(self, names: Collection[str] | None = None) -> dict[str, torch.Tensor]:
        """HF tensor name -> the engine weight (or fused slice) it fills (``names``: the
        checkpoint's, where a layer's layout depends on them)."""
        tied, stage = self.config.tie_word_embeddings, self.stage
        targets = {}
        if stage.has_embedding(tied):
            targets["model.embed_tokens.weight"] = self.embed.data
        if stage.last:
            targets["model.norm.weight"] = self.norm.data
            if not tied:
                targets["lm_head.weight"] = self.lm_head.data
        for layer in self.decoder_layers():
            targets |= layer.weight_targets(f"model.layers.{layer.index}.", names)
        return targets

    def weight_bytes(self) -> tuple[int, int]:
        """(bytes of all weights, a tied head counted once, quantized ones as packed; the
        experts' share of them, the routers excluded)."""
        total = sum(p.numel() * p.element_size() for p in self.parameters() if not p.is_meta)
        total += sum(q.nbytes for q in self.quantized_weights())
        layers = self.decoder_layers()
        experts = sum(expert_weight_bytes(x.moe) for x in layers if x.moe is not None)
        return total, experts

    def quantized_weights(self) -> list[PackedMatrix]:
        """Every quantized matrix of the model, once each."""
        packed = [self.packed_embed, self.packed_lm_head]
        packed += [p for m in self.modules() if isinstance(m, Packed) for p in m.packed.values()]
        unique = {id(p): p for p in packed if isinstance(p, PackedMatrix)}
        return list(unique.values())

    def norm_weights(self) -> list[torch.Tensor]:
        layers = self.decoder_layers()
        return [self.norm.data] + [w for layer in layers for w in layer.norm_weights()]

    def forward(
        self,
        input_ids: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: torch.Tensor,
        logits_indices: torch.Tensor,
        hidden: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids: [tokens]; logits_indices: [sampled] rows of the step to score;
        ``hidden``: on a pipeline stage after the first, the previous stage's output
        [tokens, hidden] (updated in place; None: zeros, the memory profile's).

        Writes the step's K/V into ``kv_cache``; returns logits [sampled, vocab] in the
        model dtype, or on a stage before the last its hidden states [tokens, hidden].
        """
        cfg = self.config
        h, ops = self._layers(input_ids, meta, kv_cache, hidden)
        if not self.stage.last:
            return h
        last = ops[0].norm(h[logits_indices], self.norm, cfg.rms_norm_eps)
        logits = cpu_linear.linear(last, self.lm_head, self.packed_lm_head)  # [sampled, vocab]
        logits = self.shard.gather_vocab(logits, cfg.vocab_size)
        if cfg.final_softcap:
            logits = torch.tanh(logits.div_(cfg.final_softcap)).mul_(cfg.final_softcap)
        return logits

    def hidden_states(
        self, input_ids: torch.Tensor, meta: AttentionMetadata, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        """The final norm's output [tokens, hidden] of every token of a step (pooling);
        writes the step's K/V into ``kv_cache``. The whole model only (no stage)."""
        h, ops = self._layers(input_ids, meta, kv_cache, None)
        return ops[0].norm(h, self.norm, self.config.rms_norm_eps)

    def _layers(
        self,
        input_ids: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: torch.Tensor,
        hidden: torch.Tensor | None,
    ) -> tuple[torch.Tensor, list[LayerOps]]:
        """The residual stream [tokens, hidden] after this stage's layers, and the ops."""
        h = self.embed_tokens(input_ids) if self.stage.first else hidden  # [tokens, hidden]
        if h is None:
            h = torch.zeros(
                input_ids.shape[0],
                self.config.hidden_size,
                dtype=self.embed.dtype,
                device=input_ids.device,
            )
        ops = self.step_ops(h, kv_cache, meta)
        for layer in self.layers:
            h = layer(h, ops, kv_cache, meta, self.attention)
        return h, ops

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids: [tokens] -> [tokens, hidden], scaled where the family scales."""
        cfg = self.config
        h = (  # [tokens, hidden]
            self.shard.embed(input_ids, self.embed, cfg.vocab_size)
            if self.packed_embed is None
            else self.packed_embed.rows(input_ids).to(self.norm.dtype)
        )
        if cfg.embed_scale != 1.0:  # Gemma: the scale rounded to the model dtype, as trained
            h.mul_(torch.tensor(cfg.embed_scale, dtype=h.dtype))
        return h
