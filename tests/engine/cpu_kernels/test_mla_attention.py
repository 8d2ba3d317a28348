"""The C kernel of multi-head latent attention (``mla_attention.c``) against the torch path
(absorbed decodes, expanded prefill chunks) on one step of decodes, a fresh prompt and a
chunk after a cached prefix, over fp32, int8 and fp8 latent caches, at 1 and 2 threads (and,
run under SPLITSERVE_CPU_VEC_WIDTH=8 or 16, either vector width)."""

from __future__ import annotations

import pytest
import torch

from engine import cpu_kernels
from engine.cpu_kernels.mla import mla_supported, paged_mla_attention
from engine.model import mla_attention
from engine.model.mla_kernels import c_latent, latent_kernel
from engine.model.torch_attention import TorchAttention
from tests.engine.model.mla_cases import SHAPES, mla_step

pytestmark = pytest.mark.skipif(
    not cpu_kernels.available(), reason="the CPU kernels need a C compiler (cc or $CC)"
)


@pytest.mark.parametrize("kv_dtype", ["auto", "int8", "fp8_e4m3"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_c_kernel_matches_torch(
    shape: str, kv_dtype: str, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = mla_step(SHAPES[shape], kv_dtype)
    want = step.run(None)
    backend = TorchAttention(cpu_kernel=True)
    assert latent_kernel(backend, step.query.q_pe, step.kv_cache) is c_latent
    for name in ("_decodes", "_chunk"):  # the kernel, not the torch path
        monkeypatch.setattr(mla_attention, name, _refuse)
    torch.testing.assert_close(step.run(backend), want, rtol=1e-4, atol=1e-4)


def test_the_plan_changes_no_bit(threads: int) -> None:
    """Heads split over more units (2 threads) or not (1): each row's sums in one order."""
    step = mla_step(SHAPES["many-heads"])
    torch.set_num_threads(1)
    alone = step.run(TorchAttention(cpu_kernel=True))
    torch.set_num_threads(threads)
    assert torch.equal(step.run(TorchAttention(cpu_kernel=True)), alone)


def test_other_tensors_keep_the_torch_path() -> None:
    step = mla_step(SHAPES["tiny"])
    q = step.query.q_pe
    assert not mla_supported(q.double(), step.kv_cache)
    assert not mla_supported(q, step.kv_cache.bfloat16())
    assert latent_kernel(TorchAttention(cpu_kernel=False), q, step.kv_cache) is None
    assert latent_kernel(None, q, step.kv_cache) is None


def test_a_bad_query_width_is_refused_by_name() -> None:
    step = mla_step(SHAPES["tiny"])
    index = cpu_kernels.prefill_index(
        step.meta.query_start_loc, step.meta.context_lens, step.meta.block_tables,
        step.meta.num_tokens, 4, "paged_mla_attention",
    )  # fmt: skip
    q = torch.zeros(step.meta.num_tokens, 4, 41)
    with pytest.raises(ValueError, match="paged_mla_attention: queries of 41 values"):
        paged_mla_attention(q, step.kv_cache, 1, index, 32, 0.1)
    with pytest.raises(ValueError, match="paged_mla_attention: a context shorter"):
        cpu_kernels.prefill_index(
            step.meta.query_start_loc, step.meta.context_lens - 3, step.meta.block_tables,
            step.meta.num_tokens, 4, "paged_mla_attention",
        )  # fmt: skip


def _refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError("the torch path ran instead of the kernel")
