"""Linear layers on the CPU with oneDNN-packed weights for small steps.

``F.linear`` re-packs the weight matrix on every call. At decode sizes (a few to a few
hundred rows) that packing, a full extra pass over the weights, is a large share of the
matmul: on the 2-core dev machine the layers of the default model ran 1.3-1.7x faster from
weights packed once at load (measured at 1, 8, 32 and 64 rows), about even from 128 to 512
rows depending on the run. So small steps use the packed copy and large ones (prefill) plain
``F.linear``; the packed copies cost a second copy of the linear weights in memory
(``EngineConfig.pack_cpu_weights=False`` turns them off).
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

# Steps of at most this many rows use the packed weights (the crossover measured 128-512).
PACKED_MAX_ROWS = 128


@functools.cache
def packing_available() -> bool:
    """True when this torch build packs and runs oneDNN linear weights and agrees with
    ``F.linear`` on a probe."""
    try:
        w = torch.randn(24, 16)
        x = torch.randn(3, 16)
        got = packed_linear(x, pack(w))
        return bool(torch.allclose(got, F.linear(x, w), rtol=1e-4, atol=1e-5))
    except (RuntimeError, AttributeError, NotImplementedError) as exc:
        log.info("cpu_packed_linear_unavailable error=%s", exc)
        return False


def pack(weight: torch.Tensor) -> torch.Tensor:
    """An opaque oneDNN copy of ``weight`` [out, in] (fp32, CPU) for ``linear``."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def packed_linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` from the packed copy of ``weight``, whatever the size of ``x``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def linear(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T``, from ``packed`` when given and the step is small."""
    if packed is not None and x.shape[0] <= PACKED_MAX_ROWS:
        return packed_linear(x, packed)
    return F.linear(x, weight)


def add_linear_(
    h: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None
) -> torch.Tensor:
    """``h += x @ weight.T`` in place; returns ``h``."""
    if packed is not None and x.shape[0] <= PACKED_MAX_ROWS:
        return h.add_(packed_linear(x, packed))
    return h.addmm_(x, weight.t())
