"""Multi-LoRA through the engine on a tiny random Llama: greedy output equals transformers
with the adapter merged; one batch mixing adapters and the base model equals each row run
alone, on every kernel path; adapters beyond max_loras wait; blocks all come back."""

from __future__ import annotations

from pathlib import Path

import pytest
from lora_adapters import hf_greedy, make_adapter, merged_model
from tiny_llama import save_tiny_llama
from tiny_tokenizer import save_byte_tokenizer

from engine import LLM, LoRARequest
from engine.lora.adapter import LoraLoadError
from models.sampling_params import SamplingParams

PROMPTS = [[5 + (7 * i + 3 * j) % 100 for j in range(6 + 5 * i)] for i in range(6)]
PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
ADAPTERS = {  # name -> (rank, targets, rsLoRA)
    "all": (
        8,
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        False,
    ),
    "attn": (4, ("q_proj", "v_proj"), True),
    "mlp": (16, ("gate_proj", "up_proj", "down_proj"), False),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, LoRARequest]]:
    root = tmp_path_factory.mktemp("lora")
    save_tiny_llama(root / "base", vocab_size=300)
    save_byte_tokenizer(root / "base")
    loras = {}
    for i, (name, (rank, targets, rslora)) in enumerate(ADAPTERS.items()):
        path = make_adapter(
            root / "base", root / name, seed=i, rank=rank, targets=targets, rslora=rslora
        )
        loras[name] = LoRARequest(name, i + 1, path)
    return root / "base", loras


def _llm(base: Path, **kw: object) -> LLM:
    options: dict[str, object] = dict(
        enable_lora=True, max_loras=4, max_lora_rank=16, block_size=4, num_kv_blocks=128,
        max_num_batched_tokens=24,
    )  # fmt: skip
    return LLM(base, **(options | kw))


def test_each_adapter_equals_transformers_merged(tiny: tuple[Path, dict[str, LoRARequest]]) -> None:
    base, loras = tiny
    llm = _llm(base)
    for name, lora in loras.items():
        got = [o.token_ids for o in llm.generate(PROMPTS, PARAMS, lora_request=lora)]
        want = hf_greedy(merged_model(base, lora.path), PROMPTS, PARAMS.max_tokens)
        assert got == want, name
    plain = [o.token_ids for o in llm.generate(PROMPTS, PARAMS)]
    assert plain == hf_greedy(merged_model(base, None), PROMPTS, PARAMS.max_tokens)
    assert all(p != got for p, got in zip(plain, want, strict=True))  # the adapter matters


@pytest.mark.parametrize("kernel", ["cpu_kernels", "torch"])
def test_mixed_batch_rows_equal_their_runs_alone(
    tiny: tuple[Path, dict[str, LoRARequest]], kernel: str
) -> None:
    base, loras = tiny
    llm = _llm(base, cpu_kernels=kernel == "cpu_kernels", pack_cpu_weights=kernel == "cpu_kernels")
    order = [loras["all"], None, loras["attn"], loras["mlp"], None, loras["all"]]
    alone = [
        llm.generate([p], PARAMS, lora_request=lora)[0].token_ids
        for p, lora in zip(PROMPTS, order, strict=True)
    ]
    start = llm.engine.stats().free_blocks
    mixed = llm.generate(PROMPTS, PARAMS, lora_request=order)
    assert [o.token_ids for o in mixed] == alone
    assert llm.engine.stats().free_blocks == start


def test_adapters_beyond_max_loras_wait_and_slots_are_reused(
    tiny: tuple[Path, dict[str, LoRARequest]],
) -> None:
    base, loras = tiny
    roomy = _llm(base)
    order = [loras["all"], loras["attn"], loras["mlp"], None, loras["attn"], loras["all"]]
    want = [o.token_ids for o in roomy.generate(PROMPTS, PARAMS, lora_request=order)]
    one_slot = _llm(base, max_loras=1, max_cpu_loras=2)
    assert [o.token_ids for o in one_slot.generate(PROMPTS, PARAMS, lora_request=order)] == want
    stats = one_slot.engine.lora_stats
    assert stats is not None and stats.slot_evictions >= 2 and stats.host_evictions >= 1
    assert stats.requests == {"all": 2, "attn": 2, "mlp": 1}


def test_prefix_cache_is_not_shared_across_adapters(
    tiny: tuple[Path, dict[str, LoRARequest]],
) -> None:
    base, loras = tiny
    llm = _llm(base)
    prompt = PROMPTS[-1]
    plain_first = llm.generate([prompt], PARAMS)[0].token_ids
    with_lora = llm.generate([prompt], PARAMS, lora_request=loras["all"])[0]
    fresh = _llm(base).generate([prompt], PARAMS, lora_request=loras["all"])[0]
    assert with_lora.token_ids == fresh.token_ids != plain_first
    again = llm.generate([prompt], PARAMS, lora_request=loras["all"])
    assert again[0].token_ids == fresh.token_ids


def test_bad_adapters_are_refused_naming_the_file(
    tiny: tuple[Path, dict[str, LoRARequest]], tmp_path: Path
) -> None:
    base, loras = tiny
    llm = _llm(base, max_lora_rank=8)
    with pytest.raises(LoraLoadError, match="rank 16 is above max_lora_rank 8"):
        llm.generate(PROMPTS[:1], PARAMS, lora_request=loras["mlp"])
    (tmp_path / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 8}')
    (tmp_path / "adapter_model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(LoraLoadError, match=r"adapter_model\.safetensors"):
        llm.generate(PROMPTS[:1], PARAMS, lora_request=LoRARequest("bad", 9, tmp_path))
    assert llm.engine.stats().free_blocks == llm.engine.stats().total_blocks
    base_llm = LLM(base, block_size=4, num_kv_blocks=64)
    with pytest.raises(ValueError, match="enable_lora"):
        base_llm.generate(PROMPTS[:1], PARAMS, lora_request=loras["all"])
