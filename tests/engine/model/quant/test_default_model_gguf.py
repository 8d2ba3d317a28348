"""The default model served from its own Q4_1 GGUF, packed: the same greedy tokens as its
fp32 conversion on the oracle prompts, from a quarter of the weight bytes; and from a
directory that holds the GGUF alone (no safetensors)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.cpu_kernels.quant_linear import exact_path
from engine.llm import LLM
from engine.model.quant import gguf_file
from models import resolve_model
from models.sampling_params import SamplingParams
from tests.engine.test_engine_oracle import PROMPTS
from tests.engine.tiny_llama import chunk, make_runner, step


@pytest.fixture(scope="module")
def gguf_dir(default_model_dir: Path) -> Path:
    if gguf_file(default_model_dir) is None:
        pytest.skip("SPLITSERVE_TEST_MODEL_DIR points at a copy without the GGUF")
    return default_model_dir


def test_packed_greedy_equals_the_fp32_path(gguf_dir: Path) -> None:
    packed = LLM(gguf_dir, quantization="gguf", max_num_batched_tokens=48, num_kv_blocks=512)
    fp32 = LLM(gguf_dir, quantization="none", max_num_batched_tokens=48, num_kv_blocks=512)
    prompts = [
        fp32.tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS
    ]
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    want = [o.token_ids for o in fp32.generate(prompts, params)]
    got = [o.token_ids for o in packed.generate(prompts, params)]
    for prompt, g, w in zip(PROMPTS, got, want, strict=True):
        assert g == w, f"divergence for prompt {prompt[:40]!r}"
    packed_bytes = packed.engine.runner.model.weight_bytes()[0]
    fp32_bytes = fp32.engine.runner.model.weight_bytes()[0]
    assert packed_bytes < fp32_bytes / 4  # 6 bits a weight against 32


def test_packed_logits_are_the_fp32_paths(gguf_dir: Path) -> None:
    """The GGUF's values are the fp32 conversion's. The FMA kernels sum in the same order, so
    the logits are bit for bit the fp32 path's; the small-row and AMX kernels (where the
    machine has them) sum in another order: within fp32 roundings, the same greedy token.
    The decoder layers see the step's rows, the LM head only the sampled one: both products
    must take the FMA path for the logits to be exact (a 40-row prefill on an AVX-512 machine
    without AMX runs its layers exactly and its one-row LM head on the small-row kernel)."""
    tokens = [(37 * i) % 40000 + 100 for i in range(41)]
    logits = {}
    for quantization in ("none", "gguf"):
        runner = make_runner(gguf_dir, quantization=quantization)
        prefill = step(runner, chunk("a", tokens, 0, 40, tuple(range(10))))  # 40 rows
        decode = step(runner, chunk("a", tokens, 40, 41, tuple(range(11))))  # 1 row
        logits[quantization] = (prefill, decode)
    for rows, got, want in zip((40, 1), logits["gguf"], logits["none"], strict=True):
        if not (exact_path(rows) and exact_path(1)):
            # measured 9e-5 on logits up to 34 (the sums of 30 layers in another order)
            torch.testing.assert_close(got, want, rtol=0, atol=5e-4)
            assert torch.equal(got.argmax(-1), want.argmax(-1))
        else:
            assert torch.equal(got, want), rows


def test_a_cpu_engine_serves_the_gguf_by_default(gguf_dir: Path) -> None:
    llm = LLM(gguf_dir, num_kv_blocks=16)
    assert llm.engine.runner.model.quantized_weights()


# what a GGUF-only directory holds: the config, the tokenizer files and the GGUF
GGUF_ONLY = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def test_a_directory_of_the_gguf_alone_serves_the_packed_paths_tokens(
    gguf_dir: Path, tmp_path: Path
) -> None:
    """No safetensors: the directory is valid and ``auto`` serves the GGUF, through the same
    kernels as the full directory's packed path, so the greedy tokens are equal."""
    alone = tmp_path / "gguf-only"
    alone.mkdir()
    for name in (*GGUF_ONLY, gguf_file(gguf_dir).name):  # type: ignore[union-attr]
        if (gguf_dir / name).is_file():
            (alone / name).symlink_to(gguf_dir / name)
    assert resolve_model(str(alone)) == alone
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    runs = []
    for path, quantization in ((gguf_dir, "gguf"), (alone, "auto")):
        llm = LLM(path, quantization=quantization, max_num_batched_tokens=48, num_kv_blocks=256)
        assert llm.engine.runner.model.quantized_weights()
        chats = [[{"role": "user", "content": p}] for p in PROMPTS[:3]]
        runs.append([o.token_ids for o in llm.chat(chats, params)])
    assert runs[1] == runs[0]
