"""A tiny Qwen3-MoE model through `splitserve up`: 1 prefill + 1 decode node (KV moved
between them), and a colocated node, give the offline engine's greedy text; /stats counts
the expert weights. The model is random (built with transformers' own class) with the
default model's tokenizer, so the router renders and tokenizes as for any model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cluster_harness import running_cluster
from oracle import Oracle

from tests.engine.model.tiny_families import save_family

pytestmark = pytest.mark.e2e

PROMPTS = [
    "The history of Paris spans more than two thousand years, from a settlement on an island",
    "List three prime numbers greater than one hundred, then explain why each is prime.",
]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def moe_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-qwen3-moe")
    vocab = json.loads((default_model_dir / "config.json").read_text())["vocab_size"]
    save_family("qwen3_moe", path, vocab_size=vocab)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (default_model_dir / name).is_file():
            shutil.copy(default_model_dir / name, path / name)
    return path


@pytest.mark.parametrize("layout", [["--prefill", "1", "--decode", "1"], ["--colocated"]])
def test_tiny_moe_through_the_cluster_equals_offline(
    moe_dir: Path, tmp_path: Path, layout: list[str]
) -> None:
    want = Oracle(moe_dir).complete(PROMPTS, MAX_TOKENS)
    args = [*layout, "--num-kv-blocks", "64", "--transfer", "tcp"]
    with running_cluster(moe_dir, tmp_path / "run", *args) as up:
        client = up.openai_client()
        model = client.models.list().data[0].id
        for prompt, expected in zip(PROMPTS, want, strict=True):
            got = client.completions.create(
                model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
            )
            assert got.choices[0].text == expected.text
            assert got.usage is not None and got.usage.completion_tokens == MAX_TOKENS
        for name in up.layout["nodes"]:
            info = up.stats(name).info
            assert info.architecture == "Qwen3MoeForCausalLM"
            experts = 2 * 8 * 3 * 64 * 32 * 4  # 2 sparse layers x 8 experts x gate, up, down
            assert info.expert_weight_bytes == experts and info.weight_bytes > experts
