"""A rank's share of a tensor-parallel model: the splits, and 1/TP of the weights per rank."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.model.config import ModelConfig
from engine.model.decoder import DecoderModel
from engine.model.shard import Shard, Span, shard_config
from engine.model.torch_attention import TorchAttention
from tests.engine.model.tiny_families import save_family


def test_heads_go_by_whole_kv_groups() -> None:
    # 8 query heads over 4 KV heads (groups of 2) on 2 ranks: 2 KV heads and their 4 heads each
    assert Shard(1, 2).heads(8, 4) == (Span(4, 4), Span(2, 2))
    # SmolLM2's 9 heads over 3 KV heads on 2 ranks: whole groups, as even as they go
    assert Shard(0, 2).heads(9, 3) == (Span(0, 3), Span(0, 1))
    assert Shard(1, 2).heads(9, 3) == (Span(3, 6), Span(1, 2))


def test_fewer_kv_heads_than_ranks_replicate_the_kv_head() -> None:
    # 4 heads over 1 KV head on 2 ranks: both keep KV head 0, 2 query heads each
    assert Shard(0, 2).heads(4, 1) == (Span(0, 2), Span(0, 1))
    assert Shard(1, 2).heads(4, 1) == (Span(2, 2), Span(0, 1))
    with pytest.raises(ValueError, match=r"tensor_parallel_size \(4\) cannot split 6 heads"):
        Shard(0, 4).heads(6, 2)  # 3 query heads per KV head do not split over 2 ranks


def test_linear_attention_goes_by_key_head(tmp_path: Path) -> None:
    """Qwen3-Next's Gated DeltaNet layers: each rank holds an even share of the key heads,
    each with its value heads (2 of 4 here)."""
    save_family("qwen3_next", tmp_path)
    local = shard_config(ModelConfig.from_dir(tmp_path), Shard(1, 2)).linear
    assert local is not None and (local.num_k_heads, local.num_v_heads) == (1, 2)
    assert Shard(1, 2).linear_heads(4) == Span(2, 2)
    with pytest.raises(ValueError, match=r"tensor_parallel_size \(4\) must divide linear_num"):
        Shard(0, 4).linear_heads(6)


def test_vocabulary_rows_are_padded_to_equal_parts() -> None:
    assert [Shard(r, 2).vocab(7) for r in range(2)] == [Span(0, 4), Span(4, 3)]
    assert Shard(1, 2).vocab_rows(7) == 4
    with pytest.raises(ValueError, match=r"rank 2 is not in \[0, 2\)"):
        Shard(2, 2)


def test_shard_config_divides_heads_mlp_and_shared_expert(tmp_path: Path) -> None:
    save_family("qwen2_moe", tmp_path)
    config = ModelConfig.from_dir(tmp_path)
    local = shard_config(config, Shard(1, 2))
    assert (local.num_attention_heads, local.num_key_value_heads) == (2, 1)
    assert local.intermediate_size == config.intermediate_size // 2
    assert local.moe is not None and config.moe is not None
    assert local.moe.shared_intermediate_size == config.moe.shared_intermediate_size // 2
    assert local.moe.num_experts == config.moe.num_experts  # the router scores them all


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("family", ["qwen2", "qwen2_moe", "phi3"])
def test_each_rank_holds_a_tp_th_of_the_weights_plus_the_replicated(
    tmp_path: Path, family: str
) -> None:
    save_family(family, tmp_path)
    config = ModelConfig.from_dir(tmp_path)

    def model(shard: Shard) -> DecoderModel:
        return DecoderModel(config, TorchAttention(), 64, torch.float32, "cpu", shard)

    whole = model(Shard())
    # replicated on every rank: the norms, the routers and the shared experts' gates
    replicated = whole.norm_weights() + [
        t
        for layer in whole.decoder_layers()
        if layer.moe is not None
        for t in (layer.moe.gate, getattr(layer.moe, "shared_expert_gate", None))
        if t is not None
    ]
    split = whole.weight_bytes()[0] - _bytes(replicated)
    assert split % 2 == 0
    for rank in range(2):  # 2 KV heads over 2 ranks: nothing of attention replicated
        held = model(Shard(rank, 2)).weight_bytes()[0]
        assert held == split // 2 + _bytes(replicated), (family, rank)
