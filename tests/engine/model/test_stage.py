"""Pipeline stages: which layers a stage holds, that it holds (and reads) only those weights
and its layers' KV cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_llama import save_tiny_llama

from engine.config import EngineConfig
from engine.model import shard_load
from engine.model.config import ModelConfig
from engine.model.decoder import DecoderModel
from engine.model.loader import load_weights
from engine.model.shard import Span
from engine.model.stage import Stage
from engine.model.torch_attention import TorchAttention
from engine.step.model_load import load_model
from tests.engine.model.tiny_families import save_family


def test_layers_split_into_contiguous_ranges_as_even_as_they_go() -> None:
    assert [Stage.of(7, s, 3).layers for s in range(3)] == [Span(0, 2), Span(2, 2), Span(4, 3)]
    assert [Stage.of(2, s, 2).layers for s in range(2)] == [Span(0, 1), Span(1, 1)]
    with pytest.raises(ValueError, match=r"pipeline_parallel_size \(3\) is above the model's 2"):
        Stage.of(2, 0, 3)


def test_a_stage_holds_its_layers_its_ends_embedding_and_head() -> None:
    first, last = Stage.of(4, 0, 2), Stage.of(4, 1, 2)
    assert first.holds("model.layers.1.mlp.down_proj.weight", tied=False)
    assert not first.holds("model.layers.2.mlp.down_proj.weight", tied=False)
    assert last.holds("model.layers.3.self_attn.q_proj.weight", tied=False)
    assert first.holds("model.embed_tokens.weight", tied=False)
    assert not last.holds("model.embed_tokens.weight", tied=False)
    assert last.holds("model.embed_tokens.weight", tied=True)  # the tied head
    for name in ("model.norm.weight", "lm_head.weight"):
        assert last.holds(name, tied=False) and not first.holds(name, tied=False)


def _bytes(module: Any) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


@pytest.mark.parametrize("family", ["llama", "qwen2_moe"])
def test_each_stage_holds_and_reads_only_its_layers_and_ends(
    tmp_path: Path, family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if family == "llama":  # tied: the last stage keeps the table as its head
        save_tiny_llama(tmp_path, num_hidden_layers=3)
    else:
        save_family(family, tmp_path, num_hidden_layers=3)
    config = ModelConfig.from_dir(tmp_path)
    tied = config.tie_word_embeddings

    def model(stage: Stage) -> DecoderModel:
        m = DecoderModel(config, TorchAttention(), 64, torch.float32, "cpu", stage=stage)
        load_weights(m, tmp_path)
        return m

    whole = model(Stage.whole(3))
    layers = [_bytes(layer) for layer in whole.decoder_layers()]
    table, norm = _bytes_of(whole.embed), _bytes_of(whole.norm)
    head = table if tied else _bytes_of(whole.lm_head)
    read: list[str] = []
    real_read = shard_load.read

    def recording(handle: Any, name: str, *args: Any) -> Any:
        read.append(name)
        return real_read(handle, name, *args)

    monkeypatch.setattr(shard_load, "read", recording)
    first, last = model(Stage.of(3, 0, 2)), model(Stage.of(3, 1, 2))
    assert first.weight_bytes()[0] == layers[0] + table
    assert last.weight_bytes()[0] == layers[1] + layers[2] + norm + head
    # each tensor was read by the one stage that holds it (the tied table by both ends)
    both = ["model.embed_tokens.weight"] if tied else []
    assert sorted(read) == sorted([*whole.weight_targets(), *both])


def _bytes_of(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def test_a_stage_s_kv_cache_holds_its_layers_only(tmp_path: Path) -> None:
    save_tiny_llama(tmp_path, num_hidden_layers=3)
    config = EngineConfig(model_dir=tmp_path, num_kv_blocks=8)
    model_config = ModelConfig.from_dir(tmp_path)
    whole = load_model(config, model_config).layout
    stages = [load_model(config, model_config, stage=Stage.of(3, s, 2)).layout for s in range(2)]
    assert [s.num_layers for s in stages] == [1, 2]
    assert sum(s.block_bytes for s in stages) == whole.block_bytes
