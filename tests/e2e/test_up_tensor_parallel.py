"""Prefill and decode pools of different tensor-parallel sizes through `splitserve up`: the
openai client's answers equal the offline TP=1 engine's (the oracle every TP=1 cluster test
matches), the decode node reads one copy of each prompt's KV (each head once), and Ctrl-C
leaves no process, rank workers included. A tiny random Qwen2 model (4 heads, 2 KV heads)
with the default model's tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cluster_harness import Cluster, running_cluster
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
def tiny_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-qwen2-tp")
    vocab = json.loads((default_model_dir / "config.json").read_text())["vocab_size"]
    save_family("qwen2", path, vocab_size=vocab, num_hidden_layers=3)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (default_model_dir / name).is_file():
            shutil.copy(default_model_dir / name, path / name)
    return path


def one_copy_bytes(model_dir: Path, prompt_tokens: list[int]) -> int:
    """Bytes of the prompts' KV blocks, every KV head once (fp32)."""
    config = json.loads((model_dir / "config.json").read_text())
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    block = config["num_hidden_layers"] * 2 * BLOCK_SIZE * config["num_key_value_heads"]
    blocks = sum(-(-n // BLOCK_SIZE) for n in prompt_tokens)
    return blocks * block * head_dim * 4


@pytest.mark.parametrize("tp", [["--prefill-tp", "2"], ["--decode-tp", "2"]], ids=["2x1", "1x2"])
def test_mixed_tensor_parallel_pools_answer_like_tp1(
    tiny_dir: Path, tmp_path: Path, tp: list[str]
) -> None:
    want = Oracle(tiny_dir).complete(PROMPTS, MAX_TOKENS)
    args = ["--prefill", "1", "--decode", "1", *tp, "--num-kv-blocks", "64", "--transfer", "tcp"]
    with running_cluster(tiny_dir, tmp_path / "run", *args, check_clean_exit=True) as up:
        client = up.openai_client()
        model = client.models.list().data[0].id
        prompt_tokens = []
        for prompt, expected in zip(PROMPTS, want, strict=True):
            got = client.completions.create(
                model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
            )
            assert got.choices[0].text == expected.text
            assert got.usage is not None and got.usage.completion_tokens == MAX_TOKENS
            prompt_tokens.append(got.usage.prompt_tokens)
        decode = up.node_names("decode")[0]
        counters = up.stats(decode).counters
        assert counters["transfer_ok"] == len(PROMPTS)
        assert counters["transfer_bytes"] == one_copy_bytes(tiny_dir, prompt_tokens)
        assert_idle(up)
    assert session_processes(up.proc.pid) == []


def assert_idle(up: Cluster) -> None:
    names = list(up.layout["nodes"])
    for name, stats in up.wait_idle(names).items():
        assert stats.load.free_blocks == stats.load.total_blocks, name
