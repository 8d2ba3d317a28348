"""A tiny gpt-oss model (attention sinks, sliding and full layers with a window shorter than
the prompts, MoE with biases and the clamped SwiGLU) through `splitserve up`: 1 prefill + 1
decode node over TCP, and a prefill pool of TP 2 (sinks and experts split by rank), answer
like the offline engine, and the decode node receives every layer's K/V once. The model is
random (built with transformers' own class) with the default model's tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cluster_harness import running_cluster
from oracle import Oracle
from session_procs import session_processes

from tests.engine.model.tiny_families import save_family

pytestmark = pytest.mark.e2e

PROMPTS = [  # longer than the router's local-prefill limit: each goes through the prefill pool
    "The history of Paris spans more than two thousand years. It began as a small settlement "
    "on an island in the Seine and grew into the capital of France.",
    "List three prime numbers greater than one hundred, then explain why each of them is "
    "prime, step by step, as a teacher would explain it to a curious student.",
]
MAX_TOKENS = 12
BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def gpt_oss_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-gpt-oss")
    vocab = json.loads((default_model_dir / "config.json").read_text())["vocab_size"]
    save_family("gpt_oss", path, vocab_size=vocab)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (default_model_dir / name).is_file():
            shutil.copy(default_model_dir / name, path / name)
    return path


def kv_bytes(model_dir: Path, prompt_tokens: list[int]) -> int:
    """Bytes of the prompts' K/V blocks, once (fp32), sliding and full layers alike."""
    config = json.loads((model_dir / "config.json").read_text())
    row = config["num_key_value_heads"] * config["head_dim"]
    blocks = sum(-(-n // BLOCK_SIZE) for n in prompt_tokens)
    return blocks * config["num_hidden_layers"] * 2 * BLOCK_SIZE * row * 4


@pytest.mark.parametrize("tp", [[], ["--prefill-tp", "2", "--decode-tp", "1"]], ids=["1x1", "2x1"])
def test_disaggregated_gpt_oss_answers_like_offline(
    gpt_oss_dir: Path, tmp_path: Path, tp: list[str]
) -> None:
    want = Oracle(gpt_oss_dir).complete(PROMPTS, MAX_TOKENS)
    args = ["--prefill", "1", "--decode", "1", *tp, "--num-kv-blocks", "64", "--transfer", "tcp"]
    with running_cluster(gpt_oss_dir, tmp_path / "run", *args, check_clean_exit=True) as up:
        client = up.openai_client()
        model = client.models.list().data[0].id
        prompt_tokens = []
        for prompt, expected in zip(PROMPTS, want, strict=True):
            got = client.completions.create(
                model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
            )
            assert got.choices[0].text == expected.text
            assert got.usage is not None
            prompt_tokens.append(got.usage.prompt_tokens)
        counters = up.stats(up.node_names("decode")[0]).counters
        assert counters["transfer_ok"] == len(PROMPTS)
        assert counters["transfer_bytes"] == kv_bytes(gpt_oss_dir, prompt_tokens)
        for name, stats in up.wait_idle(list(up.layout["nodes"])).items():
            assert stats.load.free_blocks == stats.load.total_blocks, name
    assert session_processes(up.proc.pid) == []
