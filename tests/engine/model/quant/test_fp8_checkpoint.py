"""FP8 checkpoints (vLLM's ``fp8`` and compressed-tensors layouts) read into weights that
equal their codes times their scales; unserved configs are refused by field."""

from __future__ import annotations

import pytest
import torch

from engine.model.quant.fp8_checkpoint import (
    Fp8ConfigError,
    Fp8Weight,
    cat_outputs,
    parse_fp8_config,
    read_module,
)

FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic"}
CT = {
    "quant_method": "compressed-tensors",
    "config_groups": {
        "group_0": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}
    },
    "ignore": ["lm_head"],
}


def _codes(out: int, inp: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(out, inp, generator=g) * 50).to(torch.float8_e4m3fn)


def _read(tensors: dict, config: dict) -> Fp8Weight:
    get = lambda name: tensors.get(name.removeprefix("m."))  # noqa: E731
    return read_module(get, "m", parse_fp8_config(config, "c"))


def test_tensor_scale() -> None:
    codes = _codes(16, 32)
    w = _read({"weight": codes, "weight_scale": torch.tensor(0.25)}, FP8)
    assert torch.equal(w.dequantize(), codes.float() * 0.25)


def test_channel_scale() -> None:
    codes, scale = _codes(16, 32), torch.rand(16, 1) + 0.1
    w = _read({"weight": codes, "weight_scale": scale}, CT)
    assert torch.equal(w.dequantize(), codes.float() * scale)
    assert parse_fp8_config(CT, "c").skipped == ("lm_head",)


def test_tile_scales_cover_ragged_edges() -> None:
    codes, scale = _codes(20, 40), torch.rand(3, 5) + 0.1  # tiles of 8 x 8, ragged
    w = _read({"weight": codes, "weight_scale_inv": scale}, dict(FP8, weight_block_size=[8, 8]))
    want = codes.float().clone()
    for o in range(20):
        for i in range(40):
            want[o, i] *= scale[o // 8, i // 8]
    assert torch.equal(w.dequantize(), want)


def test_fused_siblings_with_their_own_tensor_scales() -> None:
    parts = [
        _read({"weight": _codes(8 * (i + 1), 32, i), "weight_scale": torch.tensor(0.5 + i)}, FP8)
        for i in range(3)
    ]
    fused = cat_outputs(parts, "qkv")
    assert torch.equal(fused.dequantize(), torch.cat([p.dequantize() for p in parts]))


def test_fused_tiles_that_do_not_line_up_are_refused() -> None:
    cfg = dict(FP8, weight_block_size=[8, 8])
    a = _read({"weight": _codes(12, 16), "weight_scale_inv": torch.ones(2, 2)}, cfg)
    b = _read({"weight": _codes(8, 16), "weight_scale_inv": torch.ones(1, 2)}, cfg)
    with pytest.raises(ValueError, match=r"qkv: .* do not line up"):
        cat_outputs([a, b], "qkv")


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (dict(FP8, fmt="e5m2"), "fmt 'e5m2'"),
        (dict(FP8, weight_block_size=[128]), "weight_block_size"),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "g": {"weights": {"num_bits": 4, "type": "int", "strategy": "group"}}
                },
            },
            "4-bit 'int'",
        ),
        ({"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes'"),
    ],
)
def test_unserved_configs_are_refused_naming_the_field(config: dict, field: str) -> None:
    with pytest.raises(Fp8ConfigError, match=field):
        parse_fp8_config(config, "model/config.json")


def test_wrong_dtype_and_missing_scale_are_named() -> None:
    with pytest.raises(ValueError, match=r"m\.'weight_scale'"):
        _read({"weight": _codes(8, 8)}, FP8)
    with pytest.raises(ValueError, match=r"m\.weight is torch\.float16"):
        _read(
            {"weight": torch.zeros(8, 8, dtype=torch.float16), "weight_scale": torch.ones(1)}, FP8
        )
