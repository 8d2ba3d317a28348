"""gpt-oss MXFP4 experts: the e2m1 / e8m0 format, and a checkpoint whose experts are packed
MXFP4 loads them packed and gives the tokens of its dequantized fp32 twin, greedy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.model import moe as moe_module
from engine.model.moe import SparseMoe, expert_weight_bytes
from engine.model.quant.mxfp4 import E2M1, Mxfp4Experts, dequantize, quantize
from tests.engine.model.test_families import PATHS, PROMPTS, greedy_tokens
from tests.engine.model.test_mla import engine_of
from tests.engine.model.tiny_families import save_family

EXPERTS = ("gate_up_proj", "down_proj")


def test_dequantize_reads_nibbles_low_first_and_power_of_two_scales() -> None:
    blocks = torch.zeros(1, 16, dtype=torch.uint8)
    blocks[0, 0] = 0x3A  # low nibble 0xA (-1.0), high nibble 0x3 (1.5)
    blocks[0, 1] = 0x7F  # -6.0, then 6.0
    scales = torch.tensor([127 + 2], dtype=torch.uint8)  # x 4
    got = dequantize(blocks, scales, torch.float32)
    assert got.shape == (32,)
    assert got[:4].tolist() == [-4.0, 6.0, -24.0, 24.0] and not got[4:].any()


def test_quantize_round_trips_representable_values() -> None:
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (3, 5, 64), generator=gen)
    exps = torch.randint(-6, 3, (3, 5, 2, 1), generator=gen).float()
    values = torch.tensor(E2M1)[codes].unflatten(-1, (2, 32)) * torch.exp2(exps)
    values = values.flatten(-2)
    values[..., ::32] = 6.0 * torch.exp2(exps[..., 0])  # each block's largest: 6 x its scale
    blocks, scales = quantize(values)
    assert blocks.shape == (3, 5, 2, 16) and scales.shape == (3, 5, 2)
    assert torch.equal(dequantize(blocks, scales, torch.float32), values)


def write_mxfp4_pair(model_dir: Path, packed: Path, twin: Path) -> None:
    """From the tiny gpt-oss in ``model_dir``: ``packed`` with its experts quantized to
    MXFP4 (``*_blocks``, ``*_scales``; quant_method mxfp4), and ``twin`` with the same
    experts dequantized to fp32 in the plain layout."""
    for out in (packed, twin):
        shutil.copytree(model_dir, out)
    tensors = load_file(str(model_dir / "model.safetensors"))
    packed_t, twin_t = dict(tensors), dict(tensors)
    for name, tensor in tensors.items():
        if not name.endswith(EXPERTS):
            continue
        rows = tensor.transpose(1, 2).contiguous()  # [E, out, in]: MXFP4 blocks run along in
        blocks, scales = quantize(rows)
        del packed_t[name]
        packed_t[f"{name}_blocks"], packed_t[f"{name}_scales"] = blocks, scales
        twin_t[name] = dequantize(blocks, scales, torch.float32).transpose(1, 2).contiguous()
    save_file(packed_t, str(packed / "model.safetensors"), metadata={"format": "pt"})
    save_file(twin_t, str(twin / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((packed / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": None}
    (packed / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def mxfp4_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("gpt_oss_mxfp4")
    save_family("gpt_oss", root / "model")
    write_mxfp4_pair(root / "model", root / "mxfp4", root / "twin")
    return root / "mxfp4", root / "twin"


@pytest.mark.parametrize("path_name", list(PATHS))
def test_an_mxfp4_checkpoint_equals_its_dequantized_twin(
    mxfp4_pair: tuple[Path, Path], path_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Greedy tokens of the packed checkpoint equal its fp32 twin's on every path; on the C
    and Triton paths the experts run in the packed kernels (the torch path and the per-expert
    dequantization are never called) over weights held at 4.25 bits a value."""
    if path_name == "triton":
        pytest.importorskip("triton")
    packed, twin = mxfp4_pair
    engine = engine_of(packed, **PATHS[path_name])
    moes = [layer.moe for layer in engine.runner.model.decoder_layers()]
    assert all(isinstance(m, SparseMoe) and isinstance(m.w13, Mxfp4Experts) for m in moes)
    held = sum(expert_weight_bytes(m, include_packed=True) for m in moes if m is not None)
    assert held == len(moes) * packed_bytes(moes[0])
    if path_name != "torch":
        with monkeypatch.context() as m:
            m.setattr(moe_module, "experts_torch", _not_called)
            m.setattr(Mxfp4Experts, "__getitem__", _not_called)
            got = greedy_tokens(engine, PROMPTS)
    else:
        got = greedy_tokens(engine, PROMPTS)
    assert engine.stats().free_blocks == engine.stats().total_blocks
    assert got == greedy_tokens(engine_of(twin, **PATHS[path_name]), PROMPTS)


def packed_bytes(block: SparseMoe | None) -> int:
    """An MXFP4 block's expert bytes: half a byte a value and a byte a scale (32 values),
    and the fp32 biases."""
    assert block is not None and block.w13_bias is not None and block.w2_bias is not None
    values = block.w13.shape.numel() + block.w2.shape.numel()
    biases = block.w13_bias.numel() + block.w2_bias.numel()
    return values // 2 + values // 32 + 4 * biases


def _not_called(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("the packed experts ran outside their kernel")


def test_another_quantization_is_refused_for_an_mxfp4_checkpoint(
    mxfp4_pair: tuple[Path, Path],
) -> None:
    with pytest.raises(ValueError, match="mxfp4-quantized"):
        engine_of(mxfp4_pair[0], quantization="fp8")


def test_a_misshapen_block_tensor_is_named(mxfp4_pair: tuple[Path, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(mxfp4_pair[0], bad)
    tensors: dict[str, Any] = load_file(str(bad / "model.safetensors"))
    name = "model.layers.1.mlp.experts.gate_up_proj_scales"  # [E, 2 I, H / 32]
    tensors[name] = tensors[name][:, :, :1].contiguous()
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=name):
        engine_of(bad)


def test_two_ranks_read_their_experts_packed(mxfp4_pair: tuple[Path, Path]) -> None:
    """Each tensor-parallel rank reads only its experts' blocks and scales: the tokens of
    one rank on the dequantized twin."""
    packed, twin = mxfp4_pair
    engine = engine_of(packed, tensor_parallel_size=2)
    try:
        got = greedy_tokens(engine, PROMPTS)
    finally:
        engine.close()
    assert got == greedy_tokens(engine_of(twin), PROMPTS)


def test_random_weights_fill_packed_experts_at_the_scale_of_plain_ones(
    mxfp4_pair: tuple[Path, Path],
) -> None:
    """``load_format="random"`` (benchmarks of MXFP4 shapes) quantizes N(0, 1 / cols)
    values into the packed experts, as plain matrices get them."""
    engine = engine_of(mxfp4_pair[0], load_format="random")
    moe = engine.runner.model.decoder_layers()[1].moe
    assert isinstance(moe, SparseMoe) and isinstance(moe.w2, Mxfp4Experts)
    for experts in (moe.w13, moe.w2):
        assert isinstance(experts, Mxfp4Experts)
        std = float(torch.stack([experts[e] for e in range(experts.shape[0])]).std())
        assert 0.8 < std * experts.shape[2] ** 0.5 < 1.25
