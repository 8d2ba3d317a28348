"""Pools of different KV dtypes through `splitserve up`: a prefill pool with float32 KV and a
decode pool with int8 KV (the decode node converts the imported blocks) answer as a colocated
node with int8 KV does; the import is a real transfer, not a recompute, and every block
comes back."""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster_harness import running_cluster

pytestmark = pytest.mark.e2e

PROMPTS = [  # each over the router's local-prefill limit (32 tokens): prefilled by the pool
    "The history of Paris spans more than two thousand years, from a settlement on an island "
    "in the Seine to the capital of a kingdom, an empire and a republic. Tell it in order.",
    "To check that a number greater than one hundred is prime, divide it by every prime "
    "up to its square root; for example, the number one hundred and one is prime because",
    "The lighthouse keeper found a message in a bottle on the rocks below the tower one "
    "stormy night. He opened it by the light of his lamp, and the first words he read were",
]
MAX_TOKENS = 24
COMMON = ["--num-kv-blocks", "64", "--transfer", "tcp"]


def _answers(model_dir: Path, run_dir: Path, *args: str) -> tuple[list[str], dict]:
    with running_cluster(model_dir, run_dir, *args, *COMMON) as up:
        client = up.openai_client()
        model = client.models.list().data[0].id
        texts = [
            client.completions.create(model=model, prompt=p, max_tokens=MAX_TOKENS, temperature=0)
            .choices[0]
            .text
            for p in PROMPTS
        ]
        names = list(up.layout["nodes"])
        return texts, up.wait_idle(names)


def test_fp32_prefill_int8_decode_answers_as_int8_colocated(
    default_model_dir: Path, tmp_path: Path
) -> None:
    split, idle = _answers(
        default_model_dir,
        tmp_path / "split",
        *("--prefill", "1", "--decode", "1"),
        *("--prefill-kv-cache-dtype", "auto", "--decode-kv-cache-dtype", "int8"),
    )
    prefill, decode = idle["prefill-0"], idle["decode-0"]
    assert "kv_dtype=auto" in prefill.info.layout and "kv_dtype=int8" in decode.info.layout
    assert decode.info.capacity == prefill.info.capacity == 64
    assert prefill.info.kv_cache_bytes >= 3.5 * decode.info.kv_cache_bytes  # same blocks
    assert decode.counters.get("imports_total") == len(PROMPTS), decode.counters
    assert decode.counters.get("recomputes_total", 0) == 0
    for name, stats in idle.items():
        load = stats.load
        assert (load.free_blocks, load.leases_held, load.running) == (load.total_blocks, 0, 0), name
    colocated, _ = _answers(
        default_model_dir, tmp_path / "colocated", "--colocated", "--kv-cache-dtype", "int8"
    )
    assert split == colocated
