"""AWQ and GPTQ int4 checkpoints: their ``quantization_config`` and tensors, in one form.

Both store, per linear module, 4-bit codes packed eight to an int32, 4-bit zero points packed
the same way and a scale per (group of input columns, output column); the weight is
``(code - zero) * scale``. They differ in the packing:

- AWQ (``quant_method: awq``, ``version: gemm``): ``qweight`` [in, out / 8], each int32 holding
  eight output columns in the order 0, 2, 4, 6, 1, 3, 5, 7 (nibble i is column
  ``8 c + AWQ_ORDER[i]``); ``qzeros`` [groups, out / 8] packed alike; ``scales`` [groups, out].
- GPTQ (``quant_method: gptq``): ``qweight`` [in / 8, out], each int32 holding eight input
  rows in order; ``qzeros`` [groups, out / 8], output columns in order; ``scales``
  [groups, out]; ``g_idx`` [in], each input column's group (not monotonic when the checkpoint
  was quantized in activation order, ``desc_act``). The original format (``checkpoint_format``
  ``gptq``) stores each zero point minus one (modulo 16); ``gptq_v2`` stores it as it is.

``Int4Weight`` holds one module unpacked: codes [out, in] uint8, scales and zeros [out,
groups] fp32, and the input column order that makes the groups contiguous (activation order).
Fused siblings (q, k, v; gate, up) read the same input, so they concatenate along the output
when their column orders agree. Other bit widths, AWQ's other kernels' layouts and GPTQ
checkpoints without ``g_idx`` order information are refused by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
METHODS = ("awq", "gptq")
SUFFIXES = ("qweight", "qzeros", "scales", "g_idx")


class Int4ConfigError(ValueError):
    """A ``quantization_config`` this loader cannot serve; the message names the field."""


@dataclass(frozen=True)
class Int4Config:
    method: str  # awq | gptq
    group_size: int  # input columns per scale; -1 in the file means one group per column
    zeros_minus_one: bool  # GPTQ v1 stores each zero point minus one
    skipped: tuple[str, ...]  # modules left in full precision (AWQ's modules_to_not_convert)


def parse_int4_config(qc: dict[str, object], where: str) -> Int4Config:
    """Read an AWQ or GPTQ ``quantization_config``; refuse what we cannot serve, by field."""
    method = str(qc.get("quant_method", "")).lower()
    if method not in METHODS:
        raise Int4ConfigError(f"{where}: quant_method {method!r} is not one of {METHODS}")
    bits = qc.get("bits", qc.get("w_bit"))
    if bits != 4:
        raise Int4ConfigError(f"{where}: {method} with bits={bits!r}; only 4-bit is served")
    group = qc.get("group_size", qc.get("q_group_size", 128))
    if not isinstance(group, int) or group == 0 or group < -1:
        raise Int4ConfigError(f"{where}: group_size {group!r} is not a positive int or -1")
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise Int4ConfigError(
                f"{where}: awq version {version!r}; only the 'gemm' layout is served"
            )
        if qc.get("zero_point", True) is False:
            raise Int4ConfigError(f"{where}: awq with zero_point=false is not served")
        skipped = qc.get("modules_to_not_convert") or []
        if not isinstance(skipped, list):
            raise Int4ConfigError(f"{where}: modules_to_not_convert is not a list")
        return Int4Config("awq", group, False, tuple(str(m) for m in skipped))
    fmt = str(qc.get("checkpoint_format", "gptq")).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise Int4ConfigError(f"{where}: gptq checkpoint_format {fmt!r} is not served")
    return Int4Config("gptq", group, fmt == "gptq", ())


@dataclass
class Int4Weight:
    """One linear module's int4 weight, unpacked: ``W[o, perm[j]] = (codes[o, j] -
    zeros[o, j // group]) * scales[o, j // group]``; ``perm`` is None when the columns are in
    order (then ``perm[j] = j``)."""

    codes: torch.Tensor  # [out, in] uint8, 0..15, input columns in ``perm`` order
    scales: torch.Tensor  # [out, groups] fp32
    zeros: torch.Tensor  # [out, groups] fp32, in code units
    group_size: int
    perm: torch.Tensor | None  # [in] int64: the input column of each code column

    @property
    def shape(self) -> tuple[int, int]:
        return (self.codes.shape[0], self.codes.shape[1])

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The full-precision weight [out, in], columns in the checkpoint's order."""
        g = self.group_size
        codes = self.codes.float().view(self.codes.shape[0], -1, g)
        w = ((codes - self.zeros[:, :, None]) * self.scales[:, :, None]).view(self.shape)
        if self.perm is not None:
            w = torch.empty_like(w).index_copy_(1, self.perm, w)
        return w.to(dtype)


def cat_outputs(parts: Sequence[Int4Weight], name: str) -> Int4Weight:
    """Fused siblings (q, k, v) stacked along the output; they must share a column order."""
    first = parts[0]
    for p in parts[1:]:
        same = (p.perm is None and first.perm is None) or (
            p.perm is not None and first.perm is not None and torch.equal(p.perm, first.perm)
        )
        if p.group_size != first.group_size or not same or p.shape[1] != first.shape[1]:
            raise ValueError(
                f"{name}: the fused modules' groups or activation orders differ; "
                "they cannot share one matmul"
            )
    return Int4Weight(
        codes=torch.cat([p.codes for p in parts]),
        scales=torch.cat([p.scales for p in parts]),
        zeros=torch.cat([p.zeros for p in parts]),
        group_size=first.group_size,
        perm=first.perm,
    )


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """int32 [..., n] -> uint8 [..., n, 8]: nibble i of each word (low bits first)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    return ((packed.to(torch.int32)[..., None] >> shifts) & 0xF).to(torch.uint8)


def _awq_columns(packed: torch.Tensor) -> torch.Tensor:
    """AWQ's column-packed int32 [rows, out / 8] -> uint8 [rows, out] in column order."""
    nib = _nibbles(packed)  # [rows, out / 8, 8]: nibble i is column 8 c + AWQ_ORDER[i]
    inverse = [AWQ_ORDER.index(c) for c in range(8)]
    return nib[..., inverse].reshape(packed.shape[0], -1)


def unpack_awq(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, config: Int4Config
) -> Int4Weight:
    codes = _awq_columns(qweight).t().contiguous()  # [out, in]
    zeros = _awq_columns(qzeros).t().float()  # [out, groups]
    return _checked(codes, zeros, scales.t().float(), config, perm=None)


def unpack_gptq(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor | None,
    config: Int4Config,
) -> Int4Weight:
    rows = _nibbles(qweight.t())  # [out, in / 8, 8]: nibble i is input row 8 r + i
    codes = rows.reshape(qweight.shape[1], -1)  # [out, in]
    zeros = _nibbles(qzeros).reshape(qzeros.shape[0], -1).t().float()  # [out, groups]
    if config.zeros_minus_one:  # v1 stores zero - 1 in four bits: a zero of 0 reads as 15
        zeros = (zeros + 1) % 16
    perm = None
    if g_idx is not None:
        g_idx = g_idx.long()
        group = _group_size(config, codes.shape[1])
        if not torch.equal(g_idx, torch.arange(codes.shape[1]) // group):
            # activation order: sort the columns by group so each group is contiguous
            perm = torch.sort(g_idx, stable=True).indices
            counts = torch.bincount(g_idx, minlength=scales.shape[0])
            if bool((counts != group).any()):
                raise ValueError(f"g_idx does not give every group {group} columns")
            codes = codes[:, perm].contiguous()
    return _checked(codes, zeros, scales.t().float(), config, perm)


def _group_size(config: Int4Config, in_features: int) -> int:
    return in_features if config.group_size == -1 else config.group_size


def _checked(
    codes: torch.Tensor,
    zeros: torch.Tensor,
    scales: torch.Tensor,
    config: Int4Config,
    perm: torch.Tensor | None,
) -> Int4Weight:
    out, inp = codes.shape
    group = _group_size(config, inp)
    if inp % group:
        raise ValueError(f"{inp} input columns are not a multiple of group_size {group}")
    want = (out, inp // group)
    for what, t in (("scales", scales), ("qzeros", zeros)):
        if tuple(t.shape) != want:
            raise ValueError(f"{what} unpacks to {tuple(t.shape)}, expected {want}")
    return Int4Weight(codes, scales.contiguous(), zeros.contiguous(), group, perm)


def read_module(
    get: Callable[[str], torch.Tensor | None], prefix: str, config: Int4Config
) -> Int4Weight:
    """One module's weight from its tensors ``prefix.qweight`` etc.; ``get`` returns a tensor
    by name or None when the checkpoint lacks it (then ValueError names it)."""

    def need(suffix: str) -> torch.Tensor:
        t = get(f"{prefix}.{suffix}")
        if t is None:
            raise ValueError(f"checkpoint lacks tensor {prefix}.{suffix!r}")
        return t

    qweight, qzeros, scales = need("qweight"), need("qzeros"), need("scales")
    try:
        if config.method == "awq":
            return unpack_awq(qweight, qzeros, scales, config)
        return unpack_gptq(qweight, qzeros, scales, get(f"{prefix}.g_idx"), config)
    except ValueError as exc:
        raise ValueError(f"{prefix}: {exc}") from exc
