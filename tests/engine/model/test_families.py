"""Every family's greedy tokens equal transformers' on the same tiny random-weight model, on
the C path, the torch path and the Triton path (interpreted on the CPU without a GPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.config import EngineConfig
from engine.engine import LLMEngine
from models.sampling_params import SamplingParams
from tests.engine.model.tiny_families import DENSE, FAMILIES, MOE, hf_greedy, save_family
from tests.engine.tiny_llama import TRITON_DEVICE

# longer than every window (7) and a few blocks (4) each, of different lengths
PROMPTS = [
    [1, 17, 33, 5, 90, 12, 44, 8, 61, 23, 77, 3, 50, 19, 100, 41, 9, 66, 28],
    [1, 5, 9, 14, 120, 64, 32, 16, 8, 4, 99, 98, 97, 11],
    [1, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91],
]
NEW_TOKENS = 10
PATHS: dict[str, dict[str, Any]] = {
    "c": {"attention_backend": "torch", "cpu_kernels": True},
    "torch": {"attention_backend": "torch", "cpu_kernels": False, "pack_cpu_weights": False},
    "triton": {"attention_backend": "triton", "device": str(TRITON_DEVICE)},
}


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Path]]:
    out = {}
    for name in FAMILIES:
        path = tmp_path_factory.mktemp(name)
        out[name] = (save_family(name, path), path)
    return out


def engine_greedy(path: Path, prompts: list[list[int]], **kw: Any) -> list[list[int]]:
    config = EngineConfig(
        model_dir=path, dtype="float32", block_size=4, num_kv_blocks=128,
        max_num_batched_tokens=16, **kw,
    )  # fmt: skip
    return greedy_tokens(LLMEngine(config), prompts)


def greedy_tokens(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    """NEW_TOKENS greedy tokens of each prompt, all in the engine at once."""
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    return [tokens[str(i)] for i in range(len(prompts))]


@pytest.mark.parametrize("path_name", list(PATHS))
@pytest.mark.parametrize("family", DENSE + MOE)
def test_greedy_equals_transformers(
    family_dirs: dict[str, tuple[Any, Path]], family: str, path_name: str
) -> None:
    if path_name == "triton":
        pytest.importorskip("triton")
    hf, path = family_dirs[family]
    prompts = PROMPTS if path_name != "triton" else PROMPTS[:2]
    expected = [hf_greedy(hf, p, NEW_TOKENS) for p in prompts]
    assert engine_greedy(path, prompts, **PATHS[path_name]) == expected
