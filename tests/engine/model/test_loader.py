"""Checkpoint loading: fused projections, shards, dtypes and clear errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_llama import save_tiny_llama
from transformers import LlamaForCausalLM

from engine.model.config import ModelConfig
from engine.model.decoder import DecoderModel
from engine.model.loader import load_weights
from engine.model.torch_attention import TorchAttention
from tests.engine.model.tiny_families import save_family


def engine_model(model_dir: Path, dtype: torch.dtype = torch.float32) -> DecoderModel:
    return DecoderModel(ModelConfig.from_dir(model_dir), TorchAttention(), 64, dtype, "cpu")


def loaded(model_dir: Path, dtype: torch.dtype = torch.float32) -> DecoderModel:
    model = engine_model(model_dir, dtype)
    load_weights(model, model_dir)
    return model


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[LlamaForCausalLM, Path]:
    path = tmp_path_factory.mktemp("tiny")
    return save_tiny_llama(path, tie_word_embeddings=False), path


def test_projections_are_fused(hf_dir: tuple[LlamaForCausalLM, Path]) -> None:
    hf, path = hf_dir
    model = loaded(path)
    attn, mlp = hf.model.layers[1].self_attn, hf.model.layers[1].mlp
    layer = model.decoder_layers()[1]
    qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    assert torch.equal(layer.attn.qkv, qkv)
    assert layer.mlp is not None
    assert torch.equal(layer.mlp.gate_up, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
    assert torch.equal(model.lm_head, hf.lm_head.weight)
    assert not torch.equal(model.lm_head, model.embed)


def test_tied_head_is_the_embedding(tmp_path: Path) -> None:
    save_tiny_llama(tmp_path)
    model = loaded(tmp_path)
    assert model.lm_head is model.embed


def test_dtype_conversion(hf_dir: tuple[LlamaForCausalLM, Path]) -> None:
    hf, path = hf_dir
    model = loaded(path, torch.bfloat16)
    assert model.embed.dtype == torch.bfloat16
    assert torch.equal(model.embed, hf.model.embed_tokens.weight.to(torch.bfloat16))


def test_sharded_checkpoint(hf_dir: tuple[LlamaForCausalLM, Path], tmp_path: Path) -> None:
    hf, path = hf_dir
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 2
    sharded, single = loaded(tmp_path), loaded(path)
    for (name, a), (_, b) in zip(
        sharded.named_parameters(), single.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name


def rewrite(src: Path, dst: Path, tensors: dict[str, torch.Tensor]) -> None:
    (dst / "config.json").write_text((src / "config.json").read_text())
    save_file(tensors, str(dst / "model.safetensors"))


def test_missing_tensor_is_named(hf_dir: tuple[LlamaForCausalLM, Path], tmp_path: Path) -> None:
    _, path = hf_dir
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    rewrite(path, tmp_path, tensors)
    with pytest.raises(ValueError, match=r"lacks tensor 'model\.layers\.1\.mlp\.up_proj\.weight'"):
        load_weights(engine_model(tmp_path), tmp_path)


def test_unexpected_tensor_is_named(hf_dir: tuple[LlamaForCausalLM, Path], tmp_path: Path) -> None:
    _, path = hf_dir
    tensors = load_file(str(path / "model.safetensors"))
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    rewrite(path, tmp_path, tensors)
    with pytest.raises(ValueError, match=r"unexpected tensor 'model\.layers\.0\.self_attn\.q_proj"):
        load_weights(engine_model(tmp_path), tmp_path)


def test_wrong_shape_is_named(hf_dir: tuple[LlamaForCausalLM, Path], tmp_path: Path) -> None:
    _, path = hf_dir
    tensors = load_file(str(path / "model.safetensors"))
    tensors["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(16, 64)
    rewrite(path, tmp_path, tensors)
    with pytest.raises(
        ValueError, match=r"k_proj\.weight' has shape \(16, 64\), expected \(32, 64\)"
    ):
        load_weights(engine_model(tmp_path), tmp_path)


def test_ignored_extras(tmp_path: Path) -> None:
    """Old checkpoints carry rotary inv_freq; some tied ones still carry lm_head.weight."""
    src = tmp_path / "src"
    src.mkdir()
    save_tiny_llama(src)
    tensors = load_file(str(src / "model.safetensors"))
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    tensors["lm_head.weight"] = torch.zeros(128, 64)
    rewrite(src, tmp_path, tensors)
    model = loaded(tmp_path)
    assert torch.equal(model.lm_head, tensors["model.embed_tokens.weight"])


def test_no_weights(tmp_path: Path) -> None:
    save_tiny_llama(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"no \*\.safetensors"):
        load_weights(engine_model(tmp_path), tmp_path)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen3-moe")
    save_family("qwen3_moe", path)
    return path


def _rewrite(src: Path, dst: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    """A copy of the checkpoint in ``src`` with its tensors edited."""
    for name in ("config.json", "generation_config.json"):
        if (src / name).is_file():
            (dst / name).write_bytes((src / name).read_bytes())
    tensors = load_file(src / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors")
    return dst


def test_missing_expert_is_named(moe_dir: Path, tmp_path: Path) -> None:
    gone = "model.layers.2.mlp.experts.5.up_proj.weight"
    bad = _rewrite(moe_dir, tmp_path, lambda t: t.pop(gone))
    with pytest.raises(ValueError, match=f"{tmp_path}: checkpoint lacks tensor '{gone}'"):
        loaded(bad)


def test_misshapen_expert_is_named(moe_dir: Path, tmp_path: Path) -> None:
    name = "model.layers.0.mlp.experts.1.down_proj.weight"

    def edit(t: dict[str, torch.Tensor]) -> None:
        t[name] = t[name][:, :-1].contiguous()

    bad = _rewrite(moe_dir, tmp_path, edit)
    with pytest.raises(ValueError, match=rf"model\.safetensors: tensor '{name}' has shape"):
        loaded(bad)


def test_experts_fill_their_slots(moe_dir: Path) -> None:
    """Each hub-layout expert lands in its slot of the fused expert weights."""
    model = loaded(moe_dir)
    tensors = load_file(moe_dir / "model.safetensors")
    moe = model.decoder_layers()[2].moe
    assert moe is not None and model.decoder_layers()[1].moe is None  # mlp_only layer 1
    p = "model.layers.2.mlp.experts.3."
    gate_up = torch.cat([tensors[p + "gate_proj.weight"], tensors[p + "up_proj.weight"]])
    assert torch.equal(moe.w13[3], gate_up)
    assert torch.equal(moe.w2[3], tensors[p + "down_proj.weight"])
    assert torch.equal(moe.gate, tensors["model.layers.2.mlp.gate.weight"])
