"""Linear layers of the model on the CPU: the C kernel over weights packed once at load.

``F.linear`` re-packs the weight matrix on every call; at decode sizes (a few to a few
hundred rows) that packing, a full extra pass over the weights, is a large share of the
matmul. ``engine.cpu_kernels.linear`` reads weights packed once into 16-column panels. On the
2-core dev machine it ran the default model's layers at 150-157 GFLOP/s for 32 rows, where
``F.linear`` gave 90-97 and oneDNN with prepacked weights 104-120, and at or above
``F.linear`` from 1 to 2048 rows (``python -m bench.cpu_kernels``). The packed copies cost a
second copy of the linear weights in memory (``EngineConfig.pack_cpu_weights=False`` turns
them off); without them, or for weights the kernel does not take, it is ``F.linear``.
Quantized weights (``engine.model.quant``) stand in for the packed copy and run their own
kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine import cpu_kernels
from engine.model.quant.weight import PackedMatrix, QuantWeight

Packed = torch.Tensor | PackedMatrix


def pack(weight: torch.Tensor) -> torch.Tensor | None:
    """The packed copy of ``weight`` [out, in] for ``linear``, or None where the kernel does
    not take it (then ``linear`` uses ``F.linear``)."""
    return cpu_kernels.pack_linear_weight(weight)


def linear(x: torch.Tensor, weight: torch.Tensor, packed: Packed | None) -> torch.Tensor:
    """``x @ weight.T``, from ``packed`` when given and ``x`` is on the CPU (a packed copy is
    the CPU's: a layer moved to a GPU computes from ``weight``)."""
    if packed is None or x.device.type != "cpu":
        return F.linear(x, weight)
    if isinstance(packed, PackedMatrix):
        return packed.linear(x)
    if x.stride(-1) == 1:
        return cpu_kernels.linear(x, packed)
    return F.linear(x, weight)


def add_linear_(
    h: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, packed: Packed | None
) -> torch.Tensor:
    """``h += x @ weight.T`` in place; returns ``h``."""
    if packed is None or x.device.type != "cpu":
        return h.addmm_(x, weight.t())
    if isinstance(packed, PackedMatrix):
        return packed.linear(x, out=h)
    if packed is not None and x.stride(-1) == 1 and h.stride(-1) == 1:
        return cpu_kernels.linear(x, packed, out=h)
    return h.addmm_(x, weight.t())


def silu_mul_linear(x: torch.Tensor, packed: Packed | None) -> torch.Tensor | None:
    """``silu(x @ gate.T) * (x @ up.T)`` in one kernel for a packed [gate; up] weight that
    offers it (``QuantWeight.silu_mul``), else None."""
    if isinstance(packed, QuantWeight) and x.device.type == "cpu":
        return packed.silu_mul(x)
    return None
