"""The three sets of layer ops (torch, C kernels, Triton) do the same work, and the model
picks the Triton ones with the Triton attention backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from engine_driver import drive
from tiny_llama import TRITON_DEVICE, save_tiny_llama

from engine import cpu_kernels, triton_kernels
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.model.attention import AttentionMetadata
from engine.model.layer_ops import CpuKernelOps, LayerOps, TorchOps, TritonOps
from engine.model.rope import Rope, rope_inv_freq
from models.sampling_params import SamplingParams

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 4, 2, 16, 4
GPU_ONLY = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def needs_triton() -> None:
    pytest.importorskip("triton")
    if not triton_kernels.triton_available():
        pytest.skip("triton needs CUDA or TRITON_INTERPRET=1")


def _ops(name: str, device: torch.device, meta: AttentionMetadata) -> LayerOps:
    """Ops over the same [64, d / 2] rotary tables (positions below 64)."""
    freqs = torch.outer(torch.arange(64.0), rope_inv_freq(HEAD_DIM, Rope(10000.0)))
    cos, sin = freqs.cos().to(device), freqs.sin().to(device)
    if name == "triton":
        return TritonOps(cos, sin)
    if name == "c":
        return CpuKernelOps(cos, sin)
    pos = meta.positions
    return TorchOps(cos[pos].unsqueeze(1), sin[pos].unsqueeze(1))


@pytest.mark.parametrize("name", ["c", "triton"])
def test_layer_ops_equal_the_torch_ops(name: str) -> None:
    if name == "triton":
        needs_triton()
    elif not cpu_kernels.available():
        pytest.skip("no C compiler here")
    device = TRITON_DEVICE if name == "triton" else torch.device("cpu")
    gen = torch.Generator().manual_seed(3)
    meta = AttentionMetadata.build([5, 1], [3, 9], [[4, 1, 6], [0, 2, 7]], BLOCK, device)
    width = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    qkv = torch.randn(6, width, generator=gen).to(device)
    x = torch.randn(6, 40, generator=gen).to(device)
    weight = torch.randn(40, generator=gen).to(device)
    gate_up = torch.randn(6, 2 * 24, generator=gen).to(device)
    kv = torch.zeros(8, 2, 2, BLOCK, KV_HEADS, HEAD_DIM, device=device)
    ref, ops = _ops("torch", device, meta), _ops(name, device, meta)
    ref_kv = kv.clone()
    expected = ref.rope_write_kv(qkv.clone(), HEADS, KV_HEADS, ref_kv, 1, meta)
    got = ops.rope_write_kv(qkv, HEADS, KV_HEADS, kv, 1, meta)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kv, ref_kv, atol=1e-5, rtol=1e-5)
    assert kv[:, 1].abs().sum() > 0 and kv[:, 0].abs().sum() == 0  # layer 1 only
    torch.testing.assert_close(ops.norm(x, weight, 1e-5), ref.norm(x, weight, 1e-5))
    for act in ("silu", "gelu_tanh"):
        got, want = ops.act_mul(gate_up.clone(), act), ref.act_mul(gate_up.clone(), act)
        torch.testing.assert_close(got, want)
    # per-head q norm over a strided view of the fused projection, in place; k untouched
    head_w = torch.randn(HEAD_DIM, generator=gen).to(device)
    mine, theirs = qkv.clone(), qkv.clone()
    ops.head_norm_(mine[:, : HEADS * HEAD_DIM], HEADS, head_w, 1e-6)
    ref.head_norm_(theirs[:, : HEADS * HEAD_DIM], HEADS, head_w, 1e-6)
    torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)
    assert torch.equal(mine[:, HEADS * HEAD_DIM :], qkv[:, HEADS * HEAD_DIM :])
    head = qkv[2, HEAD_DIM : 2 * HEAD_DIM]  # token 2, head 1, by hand
    want_head = head / head.pow(2).mean().add(1e-6).sqrt() * head_w
    torch.testing.assert_close(mine[2, HEAD_DIM : 2 * HEAD_DIM], want_head, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "kv_cache_dtype",
    [
        "auto",
        # interpreted, a quantized cache costs minutes of CI for what the kernel tests cover
        pytest.param("int8", marks=GPU_ONLY),
        pytest.param("fp8_e4m3", marks=GPU_ONLY),
    ],
)
def test_triton_fused_ops_greedy_equals_the_torch_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kv_cache_dtype: str
) -> None:
    """Greedy output of the engine over the Triton backend (fused RMSNorm and RoPE + KV write
    in the forward) equals the torch path's: chunked prefill, a shared prefix, decodes; with a
    quantized cache too (the Triton writers store the torch path's rows, bit for bit)."""
    needs_triton()
    save_tiny_llama(tmp_path)
    calls = {"rms_norm": 0, "rope_write_kv": 0, "apply_rope": 0, "write_kv": 0}
    for name in calls:
        kernel = getattr(triton_kernels, name)

        def counted(*args: Any, _kernel: Any = kernel, _name: str = name) -> Any:
            calls[_name] += 1
            return _kernel(*args)

        monkeypatch.setattr(triton_kernels, name, counted)
    prompts = [[(7 * i + 3) % 128 for i in range(13)], [(5 * i + 11) % 128 for i in range(7)]]
    prompts.append(prompts[0][:9] + [77, 5])  # shares two blocks with the first
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    work = [(f"r{i}", p, greedy) for i, p in enumerate(prompts)]

    def run(**options: Any) -> dict[str, list[int]]:
        config = EngineConfig(
            model_dir=tmp_path, block_size=BLOCK, num_kv_blocks=48, max_num_batched_tokens=16,
            kv_cache_dtype=kv_cache_dtype, **options,
        )  # fmt: skip
        return drive(LLMEngine(config), work, {}, first=2)["tokens"]

    torch_tokens = run(attention_backend="torch", cpu_kernels=False, pack_cpu_weights=False)
    assert not any(calls.values())
    triton_tokens = run(attention_backend="triton", device=str(TRITON_DEVICE))
    assert triton_tokens == torch_tokens
    assert all(len(t) == 6 for t in triton_tokens.values())
    assert calls["rms_norm"] > 0
    if kv_cache_dtype != "int8":
        assert calls["rope_write_kv"] > 0
    else:  # RoPE, the keys' rotation (engine.kv_format.rows.rotate_heads_), then the write
        assert calls["apply_rope"] > 0 and calls["write_kv"] > 0


def test_c_ops_check_each_steps_indices_once_and_never_reuse_them() -> None:
    """The layers of a step share its positions and slots, checked once; a new step's
    metadata is checked again (a slot outside the cache is refused) and written where it
    says, never at the previous step's slots."""
    if not cpu_kernels.available():
        pytest.skip("no C compiler here")
    cpu = torch.device("cpu")
    width = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    first = AttentionMetadata.build([2], [0], [[3]], BLOCK, cpu)
    ops = _ops("c", cpu, first)
    kv = torch.zeros(8, 2, 2, BLOCK, KV_HEADS, HEAD_DIM)
    for layer in (0, 1):
        ops.rope_write_kv(torch.ones(2, width), HEADS, KV_HEADS, kv, layer, first)
    assert kv[3].abs().sum() > 0 and kv[5].abs().sum() == 0
    outside = AttentionMetadata.build([1], [0], [[99]], BLOCK, cpu)
    with pytest.raises(ValueError, match="a slot outside"):
        ops.rope_write_kv(torch.ones(1, width), HEADS, KV_HEADS, kv, 0, outside)
    second = AttentionMetadata.build([1], [0], [[5]], BLOCK, cpu)
    before = kv[3].clone()
    ops.rope_write_kv(torch.full((1, width), 2.0), HEADS, KV_HEADS, kv, 0, second)
    assert torch.equal(kv[3], before) and kv[5, 0].abs().sum() > 0
