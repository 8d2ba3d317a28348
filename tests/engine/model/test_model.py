"""The engine's logits equal transformers' LlamaForCausalLM on a tiny random Llama."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_llama import (
    LLAMA3_ROPE,
    TRITON_DEVICE,
    chunk,
    hf_logits,
    make_runner,
    save_tiny_llama,
    step,
)
from transformers import LlamaForCausalLM

from engine.model.attention import AttentionMetadata, TritonAttention
from engine.model.config import ModelConfig
from engine.model.rope import Rope, rope_inv_freq
from engine.step.runner import ModelRunner

ATOL = 1e-4
PROMPT_A = [(7 * i + 3) % 128 for i in range(13)]  # 13 tokens: not a multiple of the block
PROMPT_B = [(5 * i + 11) % 128 for i in range(7)]
PROMPT_C = [(3 * i + 1) % 128 for i in range(18)]
# non-contiguous, out-of-order blocks (block_size 4)
TABLE_A = (9, 2, 30, 17, 5, 41)
TABLE_B = (12, 40, 3, 25)
TABLE_C = (33, 8, 21, 1, 14, 50, 6)


@pytest.fixture(scope="module", params=["tied", "untied", "llama3"])
def tiny(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[LlamaForCausalLM, ModelRunner]:
    overrides: dict[str, object] = {
        "tied": {},
        "untied": {"tie_word_embeddings": False},
        "llama3": {"rope_parameters": LLAMA3_ROPE},
    }[request.param]
    path = tmp_path_factory.mktemp(request.param)
    hf = save_tiny_llama(path, **overrides)
    return hf, make_runner(path)


def test_oracle_logits_are_not_trivial(tiny: tuple[LlamaForCausalLM, ModelRunner]) -> None:
    hf, _ = tiny
    assert hf_logits(hf, PROMPT_A).std() > 0.5  # else an atol of 1e-4 would prove little


def test_full_prompt_in_one_chunk(tiny: tuple[LlamaForCausalLM, ModelRunner]) -> None:
    hf, runner = tiny
    logits = step(runner, chunk("a", PROMPT_A, 0, 13, TABLE_A))
    assert logits.shape == (1, 128) and logits.dtype == torch.float32
    torch.testing.assert_close(logits[0], hf_logits(hf, PROMPT_A)[-1], atol=ATOL, rtol=0)


def test_every_position_of_a_prompt(tiny: tuple[LlamaForCausalLM, ModelRunner]) -> None:
    hf, runner = tiny
    meta = AttentionMetadata.build([13], [0], [TABLE_A], 4)
    with torch.inference_mode():
        logits = runner.model(torch.tensor(PROMPT_A), meta, runner.kv_cache, torch.arange(13))
    torch.testing.assert_close(logits, hf_logits(hf, PROMPT_A), atol=ATOL, rtol=0)


def test_chunks_over_a_cached_prefix(tiny: tuple[LlamaForCausalLM, ModelRunner]) -> None:
    hf, runner = tiny
    ref = hf_logits(hf, PROMPT_C)
    for start, end in [(0, 5), (5, 6), (6, 13), (13, 18)]:  # one chunk is a single token
        logits = step(runner, chunk("c", PROMPT_C, start, end, TABLE_C))
        torch.testing.assert_close(logits[0], ref[end - 1], atol=ATOL, rtol=0)


def test_decodes_mixed_with_prefill_chunks(tiny: tuple[LlamaForCausalLM, ModelRunner]) -> None:
    hf, runner = tiny
    a, b, c = list(PROMPT_A), list(PROMPT_B), list(PROMPT_C)
    # step 1: two prompts, the second not sampled-order first
    logits = step(runner, chunk("b", b, 0, 7, TABLE_B), chunk("a", a, 0, 13, TABLE_A))
    torch.testing.assert_close(logits[0], hf_logits(hf, b)[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[1], hf_logits(hf, a)[-1], atol=ATOL, rtol=0)
    a.append(int(logits[1].argmax()))
    b.append(int(logits[0].argmax()))
    # step 2: a decode, a prefill chunk not sampled, another decode
    logits = step(
        runner,
        chunk("a", a, 13, 14, TABLE_A),
        chunk("c", c, 0, 10, TABLE_C, sample=False),
        chunk("b", b, 7, 8, TABLE_B),
    )
    assert logits.shape == (2, 128)
    torch.testing.assert_close(logits[0], hf_logits(hf, a)[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[1], hf_logits(hf, b)[-1], atol=ATOL, rtol=0)
    a.append(int(logits[0].argmax()))
    # step 3: the rest of c over its cached prefix, then a decode
    logits = step(runner, chunk("c", c, 10, 18, TABLE_C), chunk("a", a, 14, 15, TABLE_A))
    torch.testing.assert_close(logits[0], hf_logits(hf, c)[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[1], hf_logits(hf, a)[-1], atol=ATOL, rtol=0)


def test_llama3_scaling_changes_frequencies() -> None:
    plain = rope_inv_freq(16, Rope(10000.0))
    scaled = rope_inv_freq(16, Rope(10000.0, "llama3", 8.0, 64, 1.0, 4.0))
    assert scaled[0] == plain[0]  # short wavelength kept
    assert torch.allclose(scaled[-1], plain[-1] / 8.0)  # long wavelength slowed
    kept_or_slowed = (scaled == plain) | torch.isclose(scaled, plain / 8.0)
    assert not kept_or_slowed.all()  # and some are blended


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_is_close_to_fp32(tmp_path: Path, dtype: str) -> None:
    hf = save_tiny_llama(tmp_path)
    runner = make_runner(tmp_path, dtype=dtype)
    assert runner.kv_cache.dtype == getattr(torch, dtype)
    step(runner, chunk("a", PROMPT_A, 0, 9, TABLE_A, sample=False))
    logits = step(runner, chunk("a", PROMPT_A, 9, 13, TABLE_A))
    ref = hf_logits(hf, PROMPT_A)[-1]
    assert logits.dtype == torch.float32
    assert (logits[0] - ref).abs().max() < 0.05 * ref.abs().max()
    assert logits[0].argmax() == ref.argmax()


def test_model_config_reads_the_saved_tiny_model(tmp_path: Path) -> None:
    save_tiny_llama(tmp_path, rope_parameters=LLAMA3_ROPE)
    cfg = ModelConfig.from_dir(tmp_path)
    assert cfg.architecture == "LlamaForCausalLM"
    assert cfg.head_dim == 16 and cfg.num_key_value_heads == 2
    assert cfg.rope == Rope(10000.0, "llama3", 8.0, 64, 1.0, 4.0)


def test_triton_backend_through_the_runner(tmp_path: Path) -> None:
    """The GPU backend (on the GPU, else interpreted on the CPU): same logits as transformers."""
    pytest.importorskip("triton")
    from engine.triton_kernels import triton_available

    if not triton_available():
        pytest.skip("triton needs CUDA or TRITON_INTERPRET=1")
    hf = save_tiny_llama(tmp_path)
    runner = make_runner(tmp_path, attention_backend="triton", device=str(TRITON_DEVICE))
    assert isinstance(runner.model.attention, TritonAttention)
    assert runner.kv_cache.device.type == TRITON_DEVICE.type
    a, c = list(PROMPT_A), list(PROMPT_C)
    logits = step(runner, chunk("a", a, 0, 13, TABLE_A), chunk("c", c, 0, 6, TABLE_C, False))
    a.append(int(logits[0].argmax()))
    logits = step(runner, chunk("c", c, 6, 18, TABLE_C), chunk("a", a, 13, 14, TABLE_A)).cpu()
    torch.testing.assert_close(logits[0], hf_logits(hf, c)[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[1], hf_logits(hf, a)[-1], atol=ATOL, rtol=0)
