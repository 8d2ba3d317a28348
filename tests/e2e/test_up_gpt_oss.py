"""A tiny gpt-oss model (attention sinks, sliding and full layers with a window shorter than
the prompts, MoE with biases and the clamped SwiGLU) through `splitserve up`: 1 prefill + 1
decode node over TCP and NIXL, and pools of TP 2 on either side (sinks and experts split
by rank), answer like the offline engine, and the decode node receives every layer's K/V
once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_clusters import BLOCK_SIZE, DISAGGREGATED, check_disaggregated, tiny_family_dir

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def gpt_oss_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_family_dir("gpt_oss", default_model_dir, tmp_path_factory.mktemp("tiny-gpt-oss"))


def kv_bytes(model_dir: Path, prompt_tokens: list[int]) -> int:
    """Bytes of the prompts' K/V blocks, once (fp32), sliding and full layers alike."""
    config = json.loads((model_dir / "config.json").read_text())
    row = config["num_key_value_heads"] * config["head_dim"]
    blocks = sum(-(-n // BLOCK_SIZE) for n in prompt_tokens)
    return blocks * config["num_hidden_layers"] * 2 * BLOCK_SIZE * row * 4


@DISAGGREGATED
def test_disaggregated_gpt_oss_answers_like_offline(
    gpt_oss_dir: Path, tmp_path: Path, tp: list[str], transfer: str
) -> None:
    check_disaggregated(
        gpt_oss_dir, tmp_path / "run", tp, lambda n: kv_bytes(gpt_oss_dir, n), transfer
    )
