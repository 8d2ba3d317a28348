"""Tiny random-weight models of a family (transformers' own class, the default model's
tokenizer) through `splitserve up`, 1 prefill + 1 decode over TCP or NIXL, checked against the
offline engine: the texts, the bytes the decode node received, no block left held."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cluster_harness import running_cluster
from oracle import Oracle
from session_procs import session_processes

from kv_transfer import nixl_available
from tests.engine.model.tiny_families import save_family

NIXL = pytest.mark.skipif(not nixl_available(), reason="needs NIXL")
# (TP flags, transfer) of the 1P+1D clusters a family runs through: a pool of TP 2 on either
# side over TCP (head spans), and equal pools over NIXL (whole blocks). Equal pools over TCP
# (whole blocks over TCP, as the default model's 1+1 tests run them) are left out: 8-10 s a
# family for bytes the NIXL case already moves whole.
DISAGGREGATED = pytest.mark.parametrize(
    ("tp", "transfer"),
    [
        (["--prefill-tp", "2", "--decode-tp", "1"], "tcp"),
        (["--prefill-tp", "1", "--decode-tp", "2"], "tcp"),
        pytest.param([], "nixl", marks=NIXL),
    ],
    ids=["2x1", "1x2", "1x1-nixl"],
)

PROMPTS = [  # longer than the router's local-prefill limit: each goes through the prefill pool
    "The history of Paris spans more than two thousand years. It began as a small settlement "
    "on an island in the Seine and grew into the capital of France.",
    "List three prime numbers greater than one hundred, then explain why each of them is "
    "prime, step by step, as a teacher would explain it to a curious student.",
]
MAX_TOKENS = 12
BLOCK_SIZE = 16
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def tiny_family_dir(family: str, default_model_dir: Path, path: Path, **changes: Any) -> Path:
    """The tiny ``family`` model saved in ``path`` with the default model's vocabulary and
    tokenizer files."""
    vocab = json.loads((default_model_dir / "config.json").read_text())["vocab_size"]
    save_family(family, path, vocab_size=vocab, **changes)
    for name in TOKENIZER_FILES:
        if (default_model_dir / name).is_file():
            shutil.copy(default_model_dir / name, path / name)
    return path


def check_disaggregated(
    model_dir: Path,
    run_dir: Path,
    tp: list[str],
    moved_bytes: Callable[[list[int]], int],
    transfer: str = "tcp",
    follow_up: str = "",
) -> None:
    """PROMPTS through a 1P+1D cluster over ``transfer`` (``tp``: its TP flags) give the
    offline engine's texts; the decode node received ``moved_bytes(prompt token counts)``.
    ``follow_up``: then PROMPTS[0] followed by it, which the prefill node resumes from its
    prefix cache and which still gives the offline text."""
    extra = [PROMPTS[0] + follow_up] if follow_up else []
    outs = Oracle(model_dir).complete(PROMPTS + extra, MAX_TOKENS)  # one batch: no hit
    want, again = outs[: len(PROMPTS)], outs[len(PROMPTS) :]
    args = ["--prefill", "1", "--decode", "1", *tp, "--num-kv-blocks", "64"]
    args += ["--transfer", transfer]
    with running_cluster(model_dir, run_dir, *args, check_clean_exit=True) as up:
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
        assert counters.get("recomputes_total", 0) == 0, counters  # decoded what was shipped
        assert counters["transfer_bytes"] == moved_bytes(prompt_tokens)
        for prompt, expected in zip(extra, again, strict=True):
            got = client.completions.create(
                model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
            )
            assert got.choices[0].text == expected.text
            assert up.stats(up.node_names("prefill")[0]).counters["prefix_hit_tokens"] > 0
        for name, stats in up.wait_idle(list(up.layout["nodes"])).items():
            assert stats.load.free_blocks == stats.load.total_blocks, name
    assert session_processes(up.proc.pid) == []
