"""ModelRunner: what it exposes, where it writes K/V, how it orders logits and refuses input."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import pytest
import torch
from tiny_llama import chunk, hf_logits, make_runner, save_tiny_llama, step
from transformers import LlamaForCausalLM

from engine.kv.cache import KVLayout
from engine.scheduler.plan import SchedulerOutput
from engine.step.model_load import retain_freed_host_memory
from engine.step.runner import ModelRunner

PROMPT = [(11 * i + 5) % 128 for i in range(10)]
TABLE = (7, 3, 12)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[LlamaForCausalLM, ModelRunner]:
    path = tmp_path_factory.mktemp("runner")
    return save_tiny_llama(path), make_runner(path, max_model_len=32)


def test_exposes_cache_layout_and_block_count(tiny: tuple[LlamaForCausalLM, ModelRunner]) -> None:
    _, runner = tiny
    assert runner.num_blocks == 64
    assert runner.layout == KVLayout(runner.model_config.name, "float32", 4, 2, 2, 16)
    assert runner.kv_cache.shape == runner.layout.cache_shape(64)
    assert runner.kv_cache[5].numel() * 4 == runner.layout.block_bytes


def test_kv_lands_in_the_block_table_slots(tiny: tuple[LlamaForCausalLM, ModelRunner]) -> None:
    hf, runner = tiny
    runner.kv_cache.zero_()
    step(runner, chunk("a", PROMPT, 0, 10, TABLE))
    with torch.no_grad():
        cache = hf(torch.tensor([PROMPT]), use_cache=True).past_key_values
    hf_k = cache.layers[1].keys[0].transpose(0, 1)  # [tokens, kv_heads, d], after RoPE
    hf_v = cache.layers[1].values[0].transpose(0, 1)
    ours_k = runner.kv_cache[list(TABLE), 1, 0].flatten(0, 1)[:10]  # blocks 7, 3, 12 in order
    ours_v = runner.kv_cache[list(TABLE), 1, 1].flatten(0, 1)[:10]
    torch.testing.assert_close(ours_k, hf_k, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours_v, hf_v, atol=1e-5, rtol=0)
    used = set(TABLE)
    assert all(runner.kv_cache[b].abs().sum() == 0 for b in range(64) if b not in used)


def test_logits_follow_the_scheduled_order(tiny: tuple[LlamaForCausalLM, ModelRunner]) -> None:
    """Decodes run first inside the step; logits still come back in the scheduler's order."""
    hf, runner = tiny
    a, b = PROMPT[:6], PROMPT[2:]
    step(runner, chunk("a", a, 0, 5, (1, 2)), chunk("b", b, 0, 7, (4, 5)))
    logits = step(
        runner,
        chunk("b", b, 7, 8, (4, 5)),  # prefill chunk of 1 token: a decode
        chunk("x", PROMPT, 0, 9, (8, 9, 10), sample=False),
        chunk("a", a, 5, 6, (1, 2)),  # decode, scheduled last
    )
    assert logits.shape == (2, 128)
    torch.testing.assert_close(logits[0], hf_logits(hf, b)[-1], atol=1e-4, rtol=0)
    torch.testing.assert_close(logits[1], hf_logits(hf, a)[-1], atol=1e-4, rtol=0)


def test_nothing_sampled_gives_no_rows(tiny: tuple[LlamaForCausalLM, ModelRunner]) -> None:
    _, runner = tiny
    logits = step(runner, chunk("a", PROMPT, 0, 4, TABLE, sample=False))
    assert logits.shape == (0, 128)


def test_refuses_bad_steps(tiny: tuple[LlamaForCausalLM, ModelRunner]) -> None:
    _, runner = tiny
    with pytest.raises(ValueError, match="at least one"):
        runner.execute(SchedulerOutput(()))
    long = list(range(40))
    with pytest.raises(ValueError, match="max_model_len 32"):
        step(runner, chunk("a", long, 30, 33, tuple(range(9))))
    with pytest.raises(ValueError, match="block table"):
        step(runner, chunk("a", PROMPT, 0, 10, (1, 2)))


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="glibc only",
)
def test_host_memory_setting_applies_on_glibc() -> None:
    assert retain_freed_host_memory()


def test_model_dir_without_weights(tmp_path: Path) -> None:
    save_tiny_llama(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="safetensors"):
        make_runner(tmp_path)


def test_start_up_phases_are_logged_in_order(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`splitserve up` shows these lines while a node starts (launcher.up_progress)."""
    save_tiny_llama(tmp_path)
    caplog.set_level("INFO", logger="splitserve.engine.phases")
    make_runner(tmp_path, max_model_len=32)
    lines = [r.getMessage() for r in caplog.records if r.name == "splitserve.engine.phases"]
    names = [line.split()[0] for line in lines]
    assert names == [f"phase={p}" for p in ("kernels", "weights", "kv_cache") for _ in "12"]
    assert [line.split()[1].split("=")[0] for line in lines] == ["begin", "seconds"] * 3
