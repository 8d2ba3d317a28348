"""Model shape and hyper-parameters, parsed from a Hugging Face ``config.json``.

The families in ``engine.model.families`` are accepted (Llama, Mistral, Mixtral, Qwen2,
Qwen2-MoE, Qwen3, Qwen3-MoE, Phi-3, Gemma 2, Gemma 3 (and its image-text model's text part),
DeepSeek-V2 / V3, gpt-oss, GLM-4.5 MoE, SmolLM3); an option one of
them sets that is not built is refused with one clear line naming the file and the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.model import gemma3_text
from engine.model.config_fields import Fields, eos_ids, read_json
from engine.model.families import (
    SUPPORTED_ARCHITECTURES,
    MoeSpec,
    find_family,
    parse_ropes,
)
from engine.model.rope import Rope
from engine.model.specs import LinearAttnSpec, MlaSpec

__all__ = ["SUPPORTED_ARCHITECTURES", "LinearAttnSpec", "MlaSpec", "ModelConfig", "MoeSpec", "Rope"]


@dataclass(frozen=True)
class ModelConfig:
    """What the engine needs to know about a checkpoint of one of the families."""

    name: str  # the model directory's name; part of the KV layout fingerprint
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope: Rope
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_ids: frozenset[int]
    family: str = "llama"
    local_rope: Rope | None = None  # the windowed layers' rotary when it differs (Gemma 3)
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False  # per-head RMSNorm of q and k before the rotary (Qwen3, Gemma 3)
    activation: str = "silu"  # of the gated MLP: "silu" or "gelu_tanh"
    norm_offset: float = 0.0  # Gemma's norms scale by (1 + w): the loader adds 1 to w
    sandwich_norms: bool = False  # norms after attention and MLP too (Gemma 2 and 3)
    embed_scale: float = 1.0  # embeddings multiplied by it (Gemma: sqrt(hidden))
    attention_scale: float = 0.0  # 0: head_dim ** -0.5
    attn_softcap: float = 0.0  # attention scores soft-capped at it (Gemma 2); 0: off
    final_softcap: float = 0.0  # logits soft-capped at it (Gemma 2); 0: off
    layer_windows: tuple[int, ...] = field(default=())  # per layer; 0: full attention
    moe: MoeSpec | None = None
    naming: str = "hf"  # checkpoint tensor names: "hf" (separate q/k/v) or "phi3" (fused)
    # DeepSeek's latent attention: then one KV "head" of head_dim = mla.latent_dim values
    mla: MlaSpec | None = None
    attention_sinks: bool = False  # a learned per-head logit in every softmax (gpt-oss)
    rope_dims: int = 0  # the dims of a head the rotary turns (GLM-4.5, Qwen3-Next); 0: all
    nope_layers: tuple[int, ...] = ()  # layers without rotary (SmolLM3's NoPE layers)
    # Qwen3-Next: Gated DeltaNet layers (no KV: a per-request state), the others' attention
    # output gated by sigmoid(gate) (q_proj gives each head's query and gate)
    linear: LinearAttnSpec | None = None
    attn_output_gate: bool = False

    def __post_init__(self) -> None:
        for name in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "vocab_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelConfig.{name} must be an integer >= 1, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2 or self.rotary_dim % 2:
            raise ValueError(
                f"head_dim ({self.head_dim}) and its rotary part ({self.rotary_dim}) must be "
                "even for RoPE"
            )
        if not self.layer_windows:
            object.__setattr__(self, "layer_windows", (0,) * self.num_hidden_layers)
        if len(self.layer_windows) != self.num_hidden_layers:
            raise ValueError(
                f"layer_windows has {len(self.layer_windows)} entries for "
                f"{self.num_hidden_layers} layers"
            )
        if not self.attention_scale:
            object.__setattr__(self, "attention_scale", self.head_dim**-0.5)
        if self.rope_dims % 2 or not 0 <= self.rope_dims <= self.head_dim:
            raise ValueError(
                f"the rotary dims ({self.rope_dims}) must be even and at most head_dim "
                f"({self.head_dim})"
            )
        if any(not 0 <= i < self.num_hidden_layers for i in self.nope_layers):
            raise ValueError(f"nope_layers {self.nope_layers} name a layer past the model's")
        if self.mla is not None and (
            self.num_key_value_heads != 1 or self.head_dim != self.mla.latent_dim
        ):
            raise ValueError(
                "latent attention keeps one KV head of kv_lora_rank + qk_rope_head_dim "
                f"({self.mla.latent_dim}) values, got {self.num_key_value_heads} x {self.head_dim}"
            )

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def rotary_dim(self) -> int:
        """The dimensions a rotary table turns: the whole head, or MLA's rotary part."""
        return self.head_dim if self.mla is None else self.mla.qk_rope_head_dim

    @property
    def kv_layers(self) -> tuple[int, ...]:
        """The layers that keep K/V in the paged cache, in cache order (all but the
        linear-attention layers)."""
        linear = set(self.linear.layers) if self.linear is not None else set()
        return tuple(i for i in range(self.num_hidden_layers) if i not in linear)

    def is_linear_layer(self, index: int) -> bool:
        return self.linear is not None and index in self.linear.layers

    @property
    def partial_rotary(self) -> bool:
        """The rotary turns a part of each head (``rope.partial_rotary_order``)."""
        return 0 < self.rope_dims < self.head_dim

    def rope_tables(self) -> list[tuple[Rope, int]]:
        """(rope, the dims it turns) of each rotary table the layers read: the global one,
        the windowed layers' (Gemma 3), then the identity of the NoPE layers."""
        turned = self.rope_dims or self.rotary_dim
        tables = [(self.rope, turned)]
        if self.local_rope is not None:
            tables.append((self.local_rope, turned))
        if self.nope_layers:
            tables.append((self.rope, 0))
        return tables

    def rope_table(self, index: int) -> int:
        """The rotary table (of ``rope_tables``) layer ``index`` reads."""
        if index in self.nope_layers:
            return len(self.rope_tables()) - 1
        return 1 if self.local_rope is not None and self.layer_windows[index] else 0

    @property
    def sliding_window(self) -> int:
        """The window every layer shares, or 0 when some layer attends to its whole context:
        only then can blocks behind the window be given back."""
        return min(self.layer_windows)

    def is_moe_layer(self, index: int) -> bool:
        return self.moe is not None and index in self.moe.layers

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        """Parse ``config.json`` (and ``generation_config.json`` when present) of a HF dir."""
        model_dir = Path(model_dir)
        path = model_dir / "config.json"
        if not path.is_file():
            raise ValueError(f"{path}: no config.json in the model directory")
        raw = read_json(path)
        gen_path = model_dir / "generation_config.json"
        generation = read_json(gen_path) if gen_path.is_file() else {}
        return cls.from_dict(raw, source=str(path), name=model_dir.name, generation=generation)

    @classmethod
    def from_dict(
        cls,
        raw: dict[str, Any],
        source: str = "config.json",
        name: str = "model",
        generation: dict[str, Any] | None = None,
    ) -> ModelConfig:
        """Parse a config dict; ``source`` names the file in error messages."""
        fields = Fields(raw, source)
        family, architecture = find_family(fields)
        eos = eos_ids(raw.get("eos_token_id"), source)
        if architecture == gemma3_text.ARCHITECTURE:  # the text model's fields, nested
            fields = gemma3_text.text_fields(fields)
            eos |= eos_ids(fields.raw.get("eos_token_id"), fields.source)
        if generation:
            eos |= eos_ids(generation.get("eos_token_id"), f"{source} (generation_config)")
        values = _shape(fields)
        values |= family.parse(fields, values["num_hidden_layers"])
        rope, local_rope = parse_ropes(fields, family)
        try:
            return cls(
                name=name,
                architecture=architecture,
                family=family.name,
                rope=rope,
                local_rope=local_rope,
                eos_token_ids=frozenset(eos),
                **values,
            )
        except ValueError as exc:
            raise fields.error(str(exc)) from None


def _shape(fields: Fields) -> dict[str, Any]:
    """The shape fields every family has, typed and defaulted."""
    num_heads = fields.integer("num_attention_heads")
    hidden = fields.integer("hidden_size")
    return {
        "hidden_size": hidden,
        "intermediate_size": fields.integer("intermediate_size"),
        "num_hidden_layers": fields.integer("num_hidden_layers"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": fields.optional_integer("num_key_value_heads", num_heads),
        "head_dim": fields.optional_integer("head_dim", hidden // num_heads),
        "vocab_size": fields.integer("vocab_size"),
        "rms_norm_eps": fields.number("rms_norm_eps"),
        "max_position_embeddings": fields.integer("max_position_embeddings"),
        "tie_word_embeddings": bool(fields.raw.get("tie_word_embeddings", False)),
    }
