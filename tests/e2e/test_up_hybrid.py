"""A tiny Qwen3-Next model (Gated DeltaNet linear attention interleaved with gated full
attention, MoE) through `splitserve up`: 1 prefill + 1 decode node over TCP and NIXL, and
pools of different tensor-parallel sizes, answer like the offline engine, and the decode
node moves each prompt's blocks of the attention layers and its linear-attention state
record once (every rank's share of the state rides in the cells of its KV heads); a prompt
that repeats the first one and goes on resumes on the prefill node from a state checkpoint
and still answers like the offline engine. The model is random (built with transformers'
own class) with the default model's tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_clusters import BLOCK_SIZE, DISAGGREGATED, check_disaggregated, tiny_family_dir

from engine.model.config import ModelConfig

pytestmark = pytest.mark.e2e

HEADER_BYTES = 64  # engine.kv.state_record's unit header
# sent after the first prompt: the prefill node resumes from the state checkpoint it saved
# at the first prompt's last block boundary, and ships the whole state after the hit
FOLLOW_UP = " Its river, bridges and old streets draw visitors all year round."


@pytest.fixture(scope="module")
def hybrid_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_family_dir(
        "qwen3_next", default_model_dir, tmp_path_factory.mktemp("tiny-qwen3-next")
    )


def moved_bytes(model_dir: Path, prompt_tokens: list[int]) -> int:
    """Each prompt's blocks of the attention layers (fp32) and its state record's blocks: a
    unit per KV head of a header and that head's part of the state, whatever the TP."""
    config = json.loads((model_dir / "config.json").read_text())
    spec = ModelConfig.from_dir(model_dir).linear
    assert spec is not None
    kv_layers, heads = config["layer_types"].count("full_attention"), config["num_key_value_heads"]
    cell = kv_layers * 2 * BLOCK_SIZE * config["head_dim"] * 4
    conv, rec = spec.conv_state_shape, spec.recurrent_shape
    state = len(spec.layers) * (conv[0] * conv[1] + rec[0] * rec[1] * rec[2]) * 4
    record = -(-(HEADER_BYTES + -(-state // heads)) // cell)
    return sum(-(-n // BLOCK_SIZE) + record for n in prompt_tokens) * cell * heads


@DISAGGREGATED
def test_disaggregated_hybrid_answers_like_offline_and_moves_the_state_once(
    hybrid_dir: Path, tmp_path: Path, tp: list[str], transfer: str
) -> None:
    check_disaggregated(
        hybrid_dir, tmp_path / "run", tp, lambda n: moved_bytes(hybrid_dir, n), transfer,
        follow_up=FOLLOW_UP,
    )  # fmt: skip


@pytest.mark.parametrize("tp", [["--prefill-tp", "2", "--decode-tp", "1"]], ids=["2x1"])
def test_a_prefill_pool_past_the_kv_heads_ships_the_whole_state(
    default_model_dir: Path, tmp_path: Path, tp: list[str]
) -> None:
    """One KV head over a prefill pool of TP 2: both ranks hold a part of that head's state,
    the one replica the decode node reads carries all of it (the ranks gather their shares),
    so the decode node decodes the shipped state, never recomputes, and equals offline."""
    model_dir = tiny_family_dir(
        "qwen3_next", default_model_dir, tmp_path / "model", num_key_value_heads=1
    )
    check_disaggregated(model_dir, tmp_path / "run", tp, lambda n: moved_bytes(model_dir, n))
