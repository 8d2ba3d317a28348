"""The engine tests' shared helpers (tiny models, the tiny tokenizer, the engine driver) live
in this folder; the tests in its rooms import them by name. The default model's oracle runs
that several tests compare against are session fixtures here (see oracle_runs.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

sys.path.insert(0, str(Path(__file__).parent))

if TYPE_CHECKING:  # imported by the fixtures only: collecting a test here loads no model code
    from oracle_runs import GreedyRun


@pytest.fixture(scope="session")
def hf_oracle_tokens(default_model_dir: Path) -> list[list[int]]:
    """transformers' float32 greedy tokens of every chat-templated oracle prompt
    (oracle_runs.HF_NEW_TOKENS each), computed once per session."""
    from oracle_runs import hf_fp32_greedy

    return hf_fp32_greedy(default_model_dir)


@pytest.fixture(scope="session")
def fp32_logprob_run(default_model_dir: Path) -> GreedyRun:
    """The engine's float32 greedy run of the first 12 oracle prompts with top-2
    log-probabilities (defaults: float32_matmul_precision "highest", kv_cache_dtype "auto"),
    computed once per session."""
    from oracle_runs import logprob_greedy

    return logprob_greedy(default_model_dir)
