"""What the tests of the AMX kernels (quant_amx.c, quant_amx_bf16.c, prefill_attention_amx.c)
share: their skip mark and the error measure of a product."""

from __future__ import annotations

import pytest
import torch

from engine import cpu_kernels
from engine.cpu_kernels.quant_linear import amx_available

requires_amx = pytest.mark.skipif(
    not cpu_kernels.available() or not amx_available(),
    reason="no AMX here: the kernels were not built for AMX-TILE/AMX-BF16 (-march=native on a "
    "machine without them) or the OS refused the tile state",
)


def relative_error(got: torch.Tensor, want: torch.Tensor, scale: torch.Tensor) -> float:
    """Largest error over the sum of |terms| that made the element."""
    return float(((got.double() - want) / scale.clamp_min(1e-30)).abs().max())
