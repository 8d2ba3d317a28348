"""FP8 checkpoints: e4m3 weights with their scales, read into one form.

Two layouts are published for vLLM:

- ``quant_method: fp8``: ``weight`` float8_e4m3fn [out, in] and ``weight_scale`` (one fp32
  per tensor), or, with ``weight_block_size: [bn, bk]``, ``weight_scale_inv`` [out / bn,
  in / bk] (one per tile; despite the name it multiplies, as DeepSeek's checkpoints use it).
- ``quant_method: compressed-tensors`` with 8-bit ``float`` weights, ``strategy`` ``tensor``
  (``weight_scale`` [1] or []) or ``channel`` (``weight_scale`` [out, 1]).

``Fp8Weight`` holds the codes and a scale per (tile of ``block`` rows and columns): a whole
tensor is one tile, a channel a row of one tile. The weight is ``float(code) * scale``. The
engine computes with these weights and its own activations (weight-only): an ``input_scale``
(static activation scales) is read past, activations are never quantized.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


class Fp8ConfigError(ValueError):
    """A ``quantization_config`` this loader cannot serve; the message names the field."""


@dataclass(frozen=True)
class Fp8Config:
    block: tuple[int, int] | None  # (rows, columns) per scale; None: per tensor or channel
    scale_name: str  # weight_scale or weight_scale_inv
    skipped: tuple[str, ...]  # modules left in full precision (``ignore``)


def parse_fp8_config(qc: dict[str, object], where: str) -> Fp8Config:
    method = str(qc.get("quant_method", "")).lower()
    if method == "fp8":
        fmt = str(qc.get("fmt", "e4m3")).lower()
        if fmt != "e4m3":
            raise Fp8ConfigError(f"{where}: fp8 fmt {fmt!r}; only e4m3 weights are served")
        block = qc.get("weight_block_size")
        if block is None:
            return Fp8Config(None, "weight_scale", _names(qc, "ignored_layers", where))
        if not (isinstance(block, list) and len(block) == 2 and all(_pos(b) for b in block)):
            raise Fp8ConfigError(f"{where}: weight_block_size {block!r} is not [rows, cols]")
        return Fp8Config(
            (block[0], block[1]), "weight_scale_inv", _names(qc, "ignored_layers", where)
        )
    if method == "compressed-tensors":
        groups = qc.get("config_groups")
        if not isinstance(groups, dict) or not groups:
            raise Fp8ConfigError(f"{where}: compressed-tensors without config_groups")
        for name, group in groups.items():
            weights = group.get("weights") if isinstance(group, dict) else None
            if not isinstance(weights, dict):
                raise Fp8ConfigError(f"{where}: config_groups.{name} has no weights scheme")
            kind, bits = weights.get("type"), weights.get("num_bits")
            strategy = weights.get("strategy")
            if kind != "float" or bits != 8:
                raise Fp8ConfigError(
                    f"{where}: config_groups.{name}.weights is {bits}-bit {kind!r}; "
                    "only 8-bit float (fp8) weights are served"
                )
            if strategy not in ("tensor", "channel"):
                raise Fp8ConfigError(
                    f"{where}: config_groups.{name}.weights.strategy {strategy!r} is not "
                    "'tensor' or 'channel'"
                )
        return Fp8Config(None, "weight_scale", _names(qc, "ignore", where))
    raise Fp8ConfigError(f"{where}: quant_method {method!r} is not fp8 or compressed-tensors")


def _pos(v: object) -> bool:
    return isinstance(v, int) and v > 0


def _names(qc: dict[str, object], key: str, where: str) -> tuple[str, ...]:
    names = qc.get(key) or []
    if not isinstance(names, list):
        raise Fp8ConfigError(f"{where}: {key} is not a list")
    return tuple(str(n) for n in names)


@dataclass
class Fp8Weight:
    """``W[o, i] = float(codes[o, i]) * scales[o // block[0], i // block[1]]``."""

    codes: torch.Tensor  # [out, in] float8_e4m3fn
    scales: torch.Tensor  # [ceil(out / block[0]), ceil(in / block[1])] fp32
    block: tuple[int, int]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.codes.shape[0], self.codes.shape[1])

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        out, inp = self.shape
        bn, bk = self.block
        s = self.scales.repeat_interleave(bn, 0)[:out].repeat_interleave(bk, 1)[:, :inp]
        return (self.codes.float() * s).to(dtype)

    def per_row(self) -> Fp8Weight:
        """The same weight with a scale per output row (a tensor scale repeated), so modules
        with different scales can share one matmul; tile-scaled weights have no such form."""
        out, inp = self.shape
        if self.block[1] != inp:
            raise ValueError("a tile-scaled fp8 weight has no per-row scales")
        rows = self.scales.repeat_interleave(self.block[0], 0)[:out]
        return Fp8Weight(self.codes, rows.contiguous(), (1, inp))


def cat_outputs(parts: Sequence[Fp8Weight], name: str) -> Fp8Weight:
    """Fused siblings (q, k, v) stacked along the output. Tensor- and channel-scaled parts
    become channel-scaled; tile-scaled ones must share the tile and start on its boundary."""
    if all(p.block[1] == p.shape[1] for p in parts):
        parts = [p.per_row() for p in parts]
        block = (1, parts[0].shape[1])
    else:
        block = parts[0].block
        if any(p.block != block for p in parts) or any(p.shape[0] % block[0] for p in parts[:-1]):
            raise ValueError(f"{name}: the fused modules' fp8 scale tiles do not line up")
    codes = torch.cat([p.codes for p in parts])
    return Fp8Weight(codes, torch.cat([p.scales for p in parts]), block)


def read_module(
    get: Callable[[str], torch.Tensor | None], prefix: str, config: Fp8Config
) -> Fp8Weight:
    """One module's weight from ``prefix.weight`` and its scale; ``get`` returns a tensor by
    name or None when the checkpoint lacks it."""
    codes = get(f"{prefix}.weight")
    scale = get(f"{prefix}.{config.scale_name}")
    if codes is None or scale is None:
        missing = "weight" if codes is None else config.scale_name
        raise ValueError(f"checkpoint lacks tensor {prefix}.{missing!r}")
    if codes.dtype != torch.float8_e4m3fn:
        raise ValueError(f"{prefix}.weight is {codes.dtype}, not float8_e4m3fn")
    out, inp = codes.shape
    scale = scale.float()
    if config.block is not None:
        bn, bk = config.block
        block = (bn, bk)
        want = (-(-out // bn), -(-inp // bk))
    elif scale.numel() == 1:
        block, want = (out, inp), (1, 1)
    else:
        block, want = (1, inp), (out, 1)
    if scale.numel() != want[0] * want[1] or (scale.dim() == 2 and tuple(scale.shape) != want):
        raise ValueError(
            f"{prefix}.{config.scale_name} has shape {tuple(scale.shape)}, expected {want}"
        )
    return Fp8Weight(codes, scale.reshape(want).contiguous(), block)
