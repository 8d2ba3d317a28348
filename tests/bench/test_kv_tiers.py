"""bench.kv_tiers on a tiny random model: with a device KV budget too small for the
conversations, the tiers compute fewer prompt tokens and answer the same."""

from __future__ import annotations

import json
from pathlib import Path

from bench.kv_tiers import main


def test_tiers_compute_fewer_prompt_tokens_with_the_same_answers(tmp_path: Path) -> None:
    out = tmp_path / "kv_tiers.json"
    argv = ["--shape", "tiny", "--layers", "1", "--users", "4", "--turns", "4"]
    argv += ["--device-blocks", "24", "--cpu-gb", "0.01", "--out", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["outputs_identical"]
    plain, tiered = result["without_tiers"], result["with_tiers"]
    assert plain["prompt_tokens"] == tiered["prompt_tokens"]
    assert tiered["computed_prompt_tokens"] < plain["computed_prompt_tokens"]
    assert tiered["kv_tiers"]["host_hits"] > 0
    assert result["computed_prompt_tokens_ratio"] > 1
