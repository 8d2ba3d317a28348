"""The mixture-of-experts block (Mixtral, Qwen3-MoE, Qwen2-MoE and DeepSeek with their shared
experts, gpt-oss with its biases, clamped SwiGLU and MXFP4 experts).

A router scores every expert per token, the top k are kept (``engine.model.routing``) and the
token's output
is the weighted sum of those experts' gated MLPs. The experts run as grouped work over the
tokens routed to each, never a loop over tokens: torch (the reference, one matmul pair per
chosen expert over its rows, any device), the C kernel (CPU fp32, ``engine.cpu_kernels.moe``)
or the Triton fused-MoE kernels (``engine.triton_kernels.fused_moe``). The caller picks the
backend per step; the block holds its weights fused at load (gate and up rows in one
``w13`` per expert); ``engine.model.moe_names`` says which checkpoint tensors fill them.
gpt-oss's experts (biases, the clamped SwiGLU over interleaved gate / up rows) with MXFP4
packed weights run packed in the C kernel (``engine.cpu_kernels.mxfp4``) or the Triton one
(``engine.triton_kernels.mxfp4_moe``); in the model dtype, or on the torch backend, they take
the torch path (MXFP4 dequantized one expert at a time as it runs).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from engine.cpu_kernels import moe as cpu_moe
from engine.cpu_kernels import mxfp4 as cpu_mxfp4
from engine.model import linear as cpu_linear
from engine.model.layer_ops import act_mul
from engine.model.layers import optional_weight, weight
from engine.model.quant.mxfp4 import Mxfp4Experts
from engine.model.routing import Router, Routing, route, route_with
from engine.model.shard import Span
from engine.model.specs import ClampedSwiglu

ACTIVATIONS = ("silu", "gelu_tanh")
BACKENDS = ("torch", "c", "triton")
__all__ = ["Router", "Routing", "SparseMoe", "route"]


class ExpertWeights(Protocol):
    """Every expert's matrix: a tensor [E, rows, cols], or packed ones (``Mxfp4Experts``)."""

    @property
    def shape(self) -> torch.Size: ...

    def __getitem__(self, expert: int) -> torch.Tensor: ...


def clamped_swiglu(gate_up: torch.Tensor, act: ClampedSwiglu) -> torch.Tensor:
    """gpt-oss's activation: gate_up [n, 2 I] interleaves gate and up columns -> [n, I]."""
    gate = gate_up[:, ::2].clamp(max=act.limit)
    up = gate_up[:, 1::2].clamp(-act.limit, act.limit)
    return (up + 1) * (gate * torch.sigmoid(gate * act.alpha))


def _expert_act(gate_up: torch.Tensor, activation: str | ClampedSwiglu) -> torch.Tensor:
    if isinstance(activation, ClampedSwiglu):
        return clamped_swiglu(gate_up, activation)
    return act_mul(gate_up, activation)


def experts_torch(
    x: torch.Tensor,
    w13: ExpertWeights,
    w2: ExpertWeights,
    routing: Routing,
    activation: str | ClampedSwiglu,
    biases: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """sum_i weights[t, i] * expert_{ids[t, i]}(x[t]) -> [T, H]: the (token, slot) pairs
    sorted by expert, one gate/up and one down matmul per chosen expert over its contiguous
    rows, the weighted rows added back per token. x: [T, H]; w13: [E, 2 I, H]; w2: [E, H, I];
    ``biases``: the gate/up and down biases [E, 2 I] and [E, H] (gpt-oss), or None."""
    top_k = routing.ids.shape[1]
    out = torch.zeros_like(x)
    flat = routing.ids.reshape(-1)
    order = flat.argsort(stable=True)  # slots, expert by expert, tokens in order
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()
    token_of = order // top_k
    xs = x[token_of]  # [T * k, H]
    ys = torch.empty_like(xs)
    start = 0
    for expert, n in enumerate(counts):
        if n:
            rows = slice(start, start + n)
            b13, b2 = (None, None) if biases is None else (biases[0][expert], biases[1][expert])
            h = _expert_act(F.linear(xs[rows], w13[expert], b13), activation)  # [n, I]
            ys[rows] = F.linear(h, w2[expert], b2)
        start += n
    ys *= routing.weights.reshape(-1)[order].unsqueeze(1)
    return out.index_add_(0, token_of, ys)


class SparseMoe(nn.Module):
    """Router, ``num_experts`` gated MLPs of width ``moe_intermediate`` and, with
    ``shared_intermediate`` > 0, a shared expert every token takes: Qwen2-MoE's gated by a
    sigmoid (``shared_gate``), DeepSeek's not.

    Weights: ``gate`` [E, H] (the router), ``w13`` [E, 2 I, H] (gate rows, then up rows),
    ``w2`` [E, H, I]; with a shared expert ``shared_gate_up`` [2 Is, H], ``shared_down``
    [H, Is] and with ``shared_gate`` ``shared_expert_gate`` [1, H]; with ``correction_bias``
    DeepSeek-V3's ``score_bias`` [E] (fp32).
    """

    def __init__(
        self,
        hidden: int,
        moe_intermediate: int,
        num_experts: int,
        top_k: int,
        normalize: bool,
        activation: str,
        shared_intermediate: int = 0,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
        local: Span | None = None,
        router: Router | None = None,
        shared_gate: bool = True,
        correction_bias: bool = False,
        router_bias: bool = False,
        expert_bias: bool = False,
        swiglu: ClampedSwiglu | None = None,
        expert_format: str = "",
    ) -> None:
        """``local``: the experts this tensor-parallel rank holds (None: all); the others'
        share of a token is summed in by the ranks that hold them. ``router``: DeepSeek's
        grouped routing (None: ``route`` with ``top_k`` and ``normalize``). gpt-oss:
        ``router_bias``, ``expert_bias``, ``swiglu`` (its activation, over gate / up rows
        interleaved as its checkpoint stores them) and ``expert_format`` "mxfp4"."""
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"MoE activation {activation!r} is not one of {ACTIVATIONS}")
        if not 0 < top_k <= num_experts:
            raise ValueError(f"MoE top_k={top_k} must be in [1, num_experts={num_experts}]")
        self.num_experts, self.top_k, self.normalize = num_experts, top_k, normalize
        self.router = router or Router(top_k, normalize)
        self.shared_gate = shared_gate and bool(shared_intermediate)
        self.activation = activation
        self.intermediate, self.shared_intermediate = moe_intermediate, shared_intermediate
        self.local = local if local is not None else Span(0, num_experts)
        held, inter = self.local.length, moe_intermediate
        self.swiglu = swiglu
        self.gate = weight(num_experts, hidden, dtype=dtype, device=device)
        self.router_bias = optional_weight(router_bias, num_experts, dtype=dtype, device=device)
        self.w13: torch.Tensor | Mxfp4Experts
        self.w2: torch.Tensor | Mxfp4Experts
        if expert_format == "mxfp4":
            self.w13 = Mxfp4Experts(held, 2 * inter, hidden, dtype, device)
            self.w2 = Mxfp4Experts(held, hidden, inter, dtype, device)
        else:
            self.w13 = weight(held, 2 * inter, hidden, dtype=dtype, device=device)
            self.w2 = weight(held, hidden, inter, dtype=dtype, device=device)
        self.w13_bias = optional_weight(expert_bias, held, 2 * inter, dtype=dtype, device=device)
        self.w2_bias = optional_weight(expert_bias, held, hidden, dtype=dtype, device=device)
        if shared_intermediate:
            si = shared_intermediate
            self.shared_gate_up = weight(2 * si, hidden, dtype=dtype, device=device)
            self.shared_down = weight(hidden, si, dtype=dtype, device=device)
        if self.shared_gate:
            self.shared_expert_gate = weight(1, hidden, dtype=dtype, device=device)
        f32 = torch.float32
        self.score_bias = optional_weight(correction_bias, num_experts, dtype=f32, device=device)
        # CPU fp32 packed copies (see pack_cpu_weights); empty / None when off
        self.packed: dict[str, torch.Tensor] = {}
        self.packed_experts: cpu_moe.PackedExperts | None = None

    def pack_cpu_weights(self) -> None:
        """Pack the router, the experts and the shared expert for the C kernels (after
        loading); leaves them unpacked where the kernels do not take them."""
        names = ("gate", "shared_gate_up", "shared_down") if self.shared_intermediate else ("gate",)
        packed = {n: cpu_linear.pack(getattr(self, n)) for n in names}
        self.packed = {n: p for n, p in packed.items() if p is not None}
        w13, w2 = self.w13, self.w2
        plain = self.swiglu is None and self.w13_bias is None  # the kernel's experts
        if plain and isinstance(w13, torch.Tensor) and isinstance(w2, torch.Tensor):
            self.packed_experts = cpu_moe.pack_experts(w13, w2)

    def _biases(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.w13_bias is None or self.w2_bias is None:
            return None
        return self.w13_bias, self.w2_bias

    def _gpt_oss_experts(
        self, x: torch.Tensor, routing: Routing, backend: str, act: ClampedSwiglu
    ) -> torch.Tensor:
        """MXFP4 experts in the C or Triton kernel, packed; else the torch path."""
        w13, w2, biases = self.w13, self.w2, self._biases()
        if isinstance(w13, Mxfp4Experts) and isinstance(w2, Mxfp4Experts):
            packed = (w13.packed, w2.packed)
            if backend == "c" and cpu_mxfp4.supported(*packed, x):
                return cpu_mxfp4.fused_mxfp4_experts(
                    x, *routing, *packed, biases, act.alpha, act.limit
                )
            if backend == "triton":
                from engine.triton_kernels.mxfp4_moe import mxfp4_moe

                return mxfp4_moe(x, *routing, *packed, biases, act.alpha, act.limit)
        return experts_torch(x, w13, w2, routing, act, biases)

    def forward(self, x: torch.Tensor, backend: str) -> torch.Tensor:
        """x: [T, H] -> [T, H]; ``backend`` one of ``BACKENDS`` ("c" falls back to torch where
        the experts could not be packed)."""
        packed = self.packed
        logits = cpu_linear.linear(x, self.gate, packed.get("gate"))  # [T, E]
        if self.router_bias is not None:
            logits += self.router_bias
        routing = route_with(logits, self.router, self.score_bias)
        if self.local.length < self.num_experts:
            routing = local_routing(routing, self.local)
        if backend not in BACKENDS:
            raise ValueError(f"MoE backend {backend!r} is not one of {BACKENDS}")
        if self.swiglu is not None:  # gpt-oss
            out = self._gpt_oss_experts(x, routing, backend, self.swiglu)
        elif backend == "c" and self.packed_experts is not None:
            out = cpu_moe.fused_experts(x, *routing, self.packed_experts, self.activation)
        elif backend == "triton":
            from engine.triton_kernels.fused_moe import fused_moe

            assert isinstance(self.w13, torch.Tensor) and isinstance(self.w2, torch.Tensor)
            out = fused_moe(x, self.w13, self.w2, *routing, self.activation)
        else:
            out = experts_torch(x, self.w13, self.w2, routing, self.activation)
        if self.shared_intermediate:
            gate_up = cpu_linear.linear(x, self.shared_gate_up, packed.get("shared_gate_up"))
            h = act_mul(gate_up, self.activation)
            shared = cpu_linear.linear(h, self.shared_down, packed.get("shared_down"))
            if self.shared_gate:
                shared = torch.sigmoid(F.linear(x, self.shared_expert_gate)) * shared
            out += shared
        return out


def local_routing(routing: Routing, local: Span) -> Routing:
    """The routing of a rank that holds the experts ``local``: ids made local, the slots of
    other ranks' experts weighted 0 (sent to a held expert, their output dropped)."""
    ids = routing.ids - local.start
    outside = (ids < 0) | (ids >= local.length)
    return Routing(routing.weights.masked_fill(outside, 0.0), ids.masked_fill(outside, 0))


def expert_weight_bytes(block: SparseMoe, include_packed: bool = False) -> int:
    """Bytes of the block's expert weights (routed and shared; the router excluded), and of
    their CPU packed copies too with ``include_packed``."""
    mxfp4 = sum(w.nbytes for w in (block.w13, block.w2) if isinstance(w, Mxfp4Experts))
    held = (block.w13, block.w2, block.w13_bias, block.w2_bias)
    tensors: list[torch.Tensor] = [w for w in held if isinstance(w, torch.Tensor)]
    if block.shared_intermediate:
        tensors += [block.shared_gate_up, block.shared_down]
    if block.shared_gate:
        tensors.append(block.shared_expert_gate)
    if include_packed:
        tensors += [p for n, p in block.packed.items() if n != "gate"]
        tensors += list(block.packed_experts) if block.packed_experts is not None else []
    return sum(t.numel() * t.element_size() for t in tensors) + int(mxfp4)
