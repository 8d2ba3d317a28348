"""The Triton kernel of multi-head latent attention (``mla_attention``) against the torch
path (absorbed decodes, expanded prefill chunks) on one step of decodes, a fresh prompt and a
chunk after a cached prefix, over fp32, int8 and fp8 latent caches (the interpreter on the
CPU)."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE

from engine.model import mla_attention
from engine.model.attention import TritonAttention
from engine.model.mla_kernels import latent_kernel, triton_latent
from engine.triton_kernels import paged_mla_attention
from tests.engine.model.mla_cases import SHAPES, mla_step

pytest.importorskip("triton")


@pytest.mark.parametrize("kv_dtype", ["auto", "int8", "fp8_e4m3"])
@pytest.mark.parametrize("shape", ["tiny", "wide"])
def test_triton_kernel_matches_torch(
    shape: str, kv_dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = mla_step(SHAPES[shape], kv_dtype)
    want = step.run(None)
    backend = TritonAttention()
    assert latent_kernel(backend, step.query.q_pe, step.kv_cache) is triton_latent
    on_device = mla_step(SHAPES[shape], kv_dtype, device=DEVICE)
    for name in ("_decodes", "_chunk"):  # the kernel, not the torch path
        monkeypatch.setattr(mla_attention, name, _refuse)
    torch.testing.assert_close(on_device.run(backend).cpu(), want, rtol=1e-4, atol=1e-4)


def test_a_cache_that_is_not_latent_is_refused_by_name() -> None:
    step = mla_step(SHAPES["tiny"])
    kv = step.kv_cache.expand(-1, -1, 2, -1, -1, -1)  # K and V planes: a GQA cache
    q = torch.zeros(step.meta.num_tokens, 4, 40)
    meta = step.meta
    with pytest.raises(ValueError, match=r"kv must be a latent cache .*\(40, 2, 2, 4, 1, 40\)"):
        paged_mla_attention(
            q, kv, 1, meta.query_start_loc, meta.context_lens, meta.block_tables, 32, 0.1, 6
        )


def _refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError("the torch path ran instead of the kernel")
