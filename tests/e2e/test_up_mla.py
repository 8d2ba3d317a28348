"""A tiny DeepSeek-V3 model (multi-head latent attention, grouped MoE routing, a dense first
layer) through `splitserve up`: 1 prefill + 1 decode node over TCP and NIXL, and pools of different
tensor-parallel sizes, answer like the offline engine, and the decode node moves each
prompt's latent once (each rank holds the whole latent; it is never split by head). The
model is random (built with transformers' own class) with the default model's tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_clusters import BLOCK_SIZE, DISAGGREGATED, check_disaggregated, tiny_family_dir

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def mla_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_family_dir(
        "deepseek_v3", default_model_dir, tmp_path_factory.mktemp("tiny-deepseek-v3")
    )


def latent_bytes(model_dir: Path, prompt_tokens: list[int]) -> int:
    """Bytes of the prompts' latent blocks, once (fp32): kv_lora_rank + qk_rope_head_dim
    values per token and layer, whatever the heads."""
    config = json.loads((model_dir / "config.json").read_text())
    latent = config["kv_lora_rank"] + config["qk_rope_head_dim"]
    blocks = sum(-(-n // BLOCK_SIZE) for n in prompt_tokens)
    return blocks * config["num_hidden_layers"] * BLOCK_SIZE * latent * 4


@DISAGGREGATED
def test_disaggregated_mla_answers_like_offline_and_moves_the_latent_once(
    mla_dir: Path, tmp_path: Path, tp: list[str], transfer: str
) -> None:
    check_disaggregated(mla_dir, tmp_path / "run", tp, lambda n: latent_bytes(mla_dir, n), transfer)
