"""Rotary position embeddings: the variants checkpoints name, parsed and tabulated.

A ``Rope`` is what a config says about one rotary table: its base (``rope_theta``) and its
scaling, one of ``default``, ``linear`` (positions divided by ``factor``), ``dynamic`` (NTK
base stretched for contexts past the trained length), ``yarn`` (per-frequency blend of
interpolation and extrapolation, with an attention factor on cos / sin) and ``llama3``
(Llama 3.1's banded slow-down). ``Rotary`` holds the cos / sin tables a model's layers read;
a model whose local and global layers rotate differently (Gemma 3) holds two.

The tables are computed once, for every position up to the engine's ``max_model_len``.
``dynamic`` is therefore static here: the base is stretched for the longest context the
engine serves (and equals ``default`` when that is within the trained length, as
transformers computes it for contexts that short).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")


@dataclass(frozen=True)
class Rope:
    """One rotary table's parameters. ``factor`` and the rest only matter for scaled types."""

    theta: float
    type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int = 0  # trained context (llama3, yarn, dynamic)
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn: None derives it from factor / mscale
    mscale: float = 0.0  # yarn (DeepSeek-style attention factor), 0: unset
    mscale_all_dim: float = 0.0
    truncate: bool = True  # yarn: round the correction range to whole dimensions

    def __post_init__(self) -> None:
        if self.type not in ROPE_TYPES:
            raise ValueError(
                f"rope_type={self.type!r} is not supported (supported: {', '.join(ROPE_TYPES)})"
            )


def parse_rope(
    params: dict[str, Any], theta: float, max_position_embeddings: int, source: str
) -> Rope:
    """A ``Rope`` from a config's rope dict (``rope_parameters`` or ``rope_scaling``), with
    ``theta`` the base found beside it. Errors name ``source`` and the field."""
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"{source}: rope_type={rope_type!r} is not supported "
            f"(supported: {', '.join(ROPE_TYPES)})"
        )
    if rope_type == "default":
        return Rope(theta=theta)

    def number(key: str, default: float | None = None) -> float:
        value = params.get(key, default)
        if value is None:
            raise ValueError(f"{source}: rope_type {rope_type!r} needs {key!r}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{source}: rope {key!r} must be a number, got {value!r}")
        return float(value)

    original = params.get("original_max_position_embeddings")
    if rope_type == "llama3":
        return Rope(
            theta=theta,
            type=rope_type,
            factor=number("factor"),
            original_max_position_embeddings=int(number("original_max_position_embeddings")),
            low_freq_factor=number("low_freq_factor"),
            high_freq_factor=number("high_freq_factor"),
        )
    if rope_type == "yarn":
        original = int(original if original is not None else max_position_embeddings)
        factor = params.get("factor") or max_position_embeddings / original
        attention = params.get("attention_factor")
        return Rope(
            theta=theta,
            type=rope_type,
            factor=float(factor),
            original_max_position_embeddings=original,
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            attention_factor=None if attention is None else float(attention),
            mscale=float(params.get("mscale") or 0.0),
            mscale_all_dim=float(params.get("mscale_all_dim") or 0.0),
            truncate=bool(params.get("truncate", True)),
        )
    # linear and dynamic: a factor, and for dynamic the trained length
    return Rope(
        theta=theta,
        type=rope_type,
        factor=number("factor"),
        original_max_position_embeddings=max_position_embeddings,
    )


def inv_freq_and_scale(head_dim: int, rope: Rope, max_len: int) -> tuple[torch.Tensor, float]:
    """[head_dim / 2] fp32 inverse frequencies and the factor cos / sin are scaled by."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    if rope.type == "dynamic" and max_len > rope.original_max_position_embeddings:
        ratio = rope.factor * max_len / rope.original_max_position_embeddings - (rope.factor - 1)
        base = rope.theta * ratio ** (head_dim / (head_dim - 2))
        return 1.0 / (base**exponents), 1.0
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.type == "linear":
        return inv_freq / rope.factor, 1.0
    if rope.type == "llama3":
        return _llama3(inv_freq, rope), 1.0
    if rope.type == "yarn":
        return _yarn(inv_freq, head_dim, rope)
    return inv_freq, 1.0


def rope_inv_freq(head_dim: int, rope: Rope, max_len: int = 0) -> torch.Tensor:
    """[head_dim / 2] fp32 inverse frequencies of ``rope``."""
    return inv_freq_and_scale(head_dim, rope, max_len)[0]


def _llama3(inv_freq: torch.Tensor, rope: Rope) -> torch.Tensor:
    wavelen = 2 * math.pi / inv_freq
    old_len = rope.original_max_position_embeddings
    low_freq_wavelen = old_len / rope.low_freq_factor
    high_freq_wavelen = old_len / rope.high_freq_factor
    # long wavelengths are slowed by `factor`, short ones kept, the band between blended
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    blended = (1 - smooth) * scaled / rope.factor + smooth * scaled
    in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_band, blended, scaled)


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn(inv_freq: torch.Tensor, head_dim: int, rope: Rope) -> tuple[torch.Tensor, float]:
    """YaRN: high frequencies kept (extrapolated), low ones divided by ``factor``
    (interpolated), a linear ramp between the dimensions that turn ``beta_fast`` and
    ``beta_slow`` times over the trained context."""
    old_len, base = rope.original_max_position_embeddings, rope.theta

    def dim_of(rotations: float) -> float:  # the dimension that turns `rotations` times
        return (head_dim * math.log(old_len / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = dim_of(rope.beta_fast), dim_of(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (keep the frequency), 0: interpolate
    inv_freq = (inv_freq / rope.factor) * (1 - keep) + inv_freq * keep
    if rope.attention_factor is not None:
        scale = rope.attention_factor
    elif rope.mscale and rope.mscale_all_dim:
        scale = _yarn_mscale(rope.factor, rope.mscale) / _yarn_mscale(
            rope.factor, rope.mscale_all_dim
        )
    else:
        scale = _yarn_mscale(rope.factor)
    return inv_freq, scale


class Rotary(nn.Module):
    """Precomputed cos/sin tables ``[max_len, head_dim / 2]`` (rotate-half convention).

    ``turned``: the dimensions the rotary turns (None: all). The columns past ``turned / 2``
    are the identity (cos 1, sin 0): 0 makes a NoPE layer's table (SmolLM3), a part of the
    head a partial rotary's, the head laid out by ``partial_rotary_order``."""

    def __init__(
        self,
        head_dim: int,
        rope: Rope,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
        turned: int | None = None,
    ) -> None:
        super().__init__()
        turned = head_dim if turned is None else turned
        cos = torch.ones(max_len, head_dim // 2)
        sin = torch.zeros(max_len, head_dim // 2)
        if turned:
            inv_freq, scale = inv_freq_and_scale(turned, rope, max_len)
            freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
            cos[:, : turned // 2] = freqs.cos() * scale
            sin[:, : turned // 2] = freqs.sin() * scale
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer("cos", cos.to(device, dtype), persistent=False)
        self.register_buffer("sin", sin.to(device, dtype), persistent=False)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for ``positions`` [tokens]: each [tokens, 1, head_dim / 2]."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def partial_rotary_order(head_dim: int, turned: int) -> torch.Tensor:
    """[head_dim] int64: for each dimension of a head as the engine lays it out, the
    checkpoint's dimension it holds, where a rotary turns the first ``turned`` dimensions
    in rotate-half pairs ``(i, i + turned / 2)`` and passes the rest (GLM-4.5).

    The engine's layout puts each such pair at ``(i, i + head_dim / 2)``, the pairs of a
    whole-head rotary, so every kernel rotates it with a ``Rotary(turned=turned)`` table.
    q and k share the order: their products, and so the attention, are unchanged."""
    passed = torch.arange(turned, head_dim).view(2, -1)  # the passed dims, in two halves
    rotated = torch.arange(turned).view(2, -1)  # [2, turned / 2]: the pairs' two sides
    order = torch.cat([rotated, passed], dim=1)  # [2, head_dim / 2]
    return order.reshape(-1)
