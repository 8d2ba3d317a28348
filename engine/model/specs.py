"""The option groups a family's config can switch on beyond the plain decoder: mixture of
experts (which layers, how tokens are routed) and multi-head latent attention (DeepSeek's
low-rank q and kv projections)."""

from __future__ import annotations

from dataclasses import dataclass

SCORINGS = ("softmax", "sigmoid")
EXPERT_FORMATS = ("", "mxfp4")
GROUP_SCORES = ("", "max", "top2")


@dataclass(frozen=True)
class ClampedSwiglu:
    """gpt-oss's expert activation over interleaved gate / up columns:
    ``(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)`` with ``g = min(gate, limit)``."""

    alpha: float
    limit: float

    def __post_init__(self) -> None:
        if self.limit <= 0:
            raise ValueError(f"swiglu_limit must be > 0, got {self.limit}")


@dataclass(frozen=True)
class MoeSpec:
    """Mixture-of-experts layers: which layers, how many experts, how they are routed."""

    num_experts: int
    top_k: int
    intermediate_size: int  # of one expert
    normalize: bool  # renormalise the top-k routing weights to sum 1
    shared_intermediate_size: int  # the shared expert's (all of them together); 0: none
    layers: tuple[int, ...]  # the sparse layers (the others have a dense MLP)
    naming: str  # checkpoint names: "mixtral", "qwen_moe", "deepseek" or "gpt_oss"
    scoring: str = "softmax"  # of the router logits: "softmax" or "sigmoid" (DeepSeek-V3)
    group_score: str = ""  # expert groups ranked by: "" (no groups), "max" (V2), "top2" (V3)
    num_groups: int = 1  # n_group
    topk_groups: int = 1  # topk_group: the groups a token's experts may come from
    scaling: float = 1.0  # routed_scaling_factor, on the routed experts' weights
    correction_bias: bool = False  # e_score_correction_bias, added to choose (V3)
    shared_gate: bool = True  # Qwen2-MoE's sigmoid gate on the shared expert
    router_bias: bool = False  # a bias on the router's logits (gpt-oss)
    expert_bias: bool = False  # biases on each expert's gate/up and down (gpt-oss)
    swiglu: ClampedSwiglu | None = None  # gpt-oss's activation; None: the model's
    expert_format: str = ""  # "": the model dtype; "mxfp4": packed 4-bit (gpt-oss)

    def __post_init__(self) -> None:
        if self.expert_format not in EXPERT_FORMATS:
            raise ValueError(
                f"MoeSpec.expert_format must be one of {EXPERT_FORMATS}, got {self.expert_format!r}"
            )
        if self.scoring not in SCORINGS:
            raise ValueError(f"MoeSpec.scoring must be one of {SCORINGS}, got {self.scoring!r}")
        if self.group_score not in GROUP_SCORES:
            raise ValueError(
                f"MoeSpec.group_score must be one of {GROUP_SCORES}, got {self.group_score!r}"
            )
        if self.num_experts % self.num_groups:
            raise ValueError(
                f"n_group ({self.num_groups}) must divide the experts ({self.num_experts})"
            )
        if not 0 < self.topk_groups <= self.num_groups:
            raise ValueError(f"topk_group ({self.topk_groups}) must be in [1, {self.num_groups}]")


@dataclass(frozen=True)
class MlaSpec:
    """Multi-head latent attention (DeepSeek-V2 / V3): q through a rank-``q_lora_rank``
    bottleneck (0: one projection), keys and values compressed into a ``kv_lora_rank``
    latent shared by every head, plus one ``qk_rope_head_dim`` rotary key shared by every
    head. The KV cache stores the latent and the rotary key: ``latent_dim`` values a token."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool  # rotary pairs (x0, x1), (x2, x3), ... in the checkpoint's rows

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.q_lora_rank < 0:
            raise ValueError(f"q_lora_rank must be >= 0, got {self.q_lora_rank}")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even, got {self.qk_rope_head_dim}")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Values a token stores per layer: the latent, then the rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class LinearAttnSpec:
    """Gated DeltaNet linear attention (Qwen3-Next) on ``layers``: q and k of ``num_k_heads``
    heads of ``k_head_dim``, v of ``num_v_heads`` heads of ``v_head_dim``, through a causal
    depthwise conv of ``conv_kernel`` taps. A request carries, per such layer, a conv state
    (the last ``conv_kernel - 1`` inputs of the conv) and a recurrent state (a
    ``k_head_dim x v_head_dim`` matrix per value head) instead of KV blocks."""

    layers: tuple[int, ...]
    num_k_heads: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int

    def __post_init__(self) -> None:
        for name in ("num_k_heads", "num_v_heads", "k_head_dim", "v_head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.conv_kernel < 2:
            raise ValueError(f"linear_conv_kernel_dim must be >= 2, got {self.conv_kernel}")
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"linear_num_value_heads ({self.num_v_heads}) must be a multiple of "
                f"linear_num_key_heads ({self.num_k_heads})"
            )

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.k_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.v_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the conv: q, k and v side by side."""
        return 2 * self.key_dim + self.value_dim

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        return (self.conv_dim, self.conv_kernel - 1)

    @property
    def recurrent_shape(self) -> tuple[int, int, int]:
        return (self.num_v_heads, self.k_head_dim, self.v_head_dim)

    def describe(self) -> str:
        """The state's shape in one token, for the KV layout's fingerprint and logs (the
        conv state is in the model dtype, the recurrent one in float32)."""
        conv, rec = self.conv_state_shape, self.recurrent_shape
        return (
            f"gdn-state[layers={len(self.layers)},conv={conv[0]}x{conv[1]},"
            f"recurrent={rec[0]}x{rec[1]}x{rec[2]}:float32]"
        )
