"""AWQ and GPTQ int4 tensors unpack to the weights their checkpoints mean, and their configs
are read or refused by field."""

from __future__ import annotations

import pytest
import torch
from int4_writer import awq_tensors, dequantize, gptq_tensors, quantize

from engine.model.quant.int4_checkpoint import (
    Int4ConfigError,
    Int4Weight,
    cat_outputs,
    parse_int4_config,
    read_module,
)

AWQ = {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm", "zero_point": True}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False}


def _weight(out: int = 24, inp: int = 64, seed: int = 0) -> torch.Tensor:
    return torch.randn(out, inp, generator=torch.Generator().manual_seed(seed))


def _read(tensors: dict, config: dict) -> Int4Weight:
    return read_module(
        lambda n: tensors.get(n.removeprefix("m.")), "m", parse_int4_config(config, "c")
    )


def test_awq_word_order_is_the_published_one() -> None:
    # one word 0x76543210: nibble i holds i, and nibble i is column AWQ_ORDER[i]
    word = torch.tensor([[0x76543210]], dtype=torch.int32)
    zeros = torch.zeros(1, 1, dtype=torch.int32)
    scales = torch.ones(1, 8, dtype=torch.float16)
    cfg = dict(AWQ, group_size=1)
    w = _read({"qweight": word, "qzeros": zeros, "scales": scales}, cfg)
    assert w.dequantize()[:, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]


@pytest.mark.parametrize("layout", ["awq", "gptq_v1", "gptq_v2", "gptq_act_order"])
def test_unpacked_weight_equals_the_checkpoints_meaning(layout: str) -> None:
    codes, zeros, scales = quantize(_weight(), group=32)
    zeros[0, 0], zeros[1, 1] = 0, 15  # the ends of the range (v1 stores 0 as 15)
    want = dequantize(codes, zeros, scales)
    if layout == "awq":
        w = _read(awq_tensors(codes, zeros, scales), AWQ)
    elif layout == "gptq_act_order":
        perm = torch.randperm(64, generator=torch.Generator().manual_seed(3))
        tensors = gptq_tensors(codes, zeros, scales, perm=perm)
        w = _read(tensors, dict(GPTQ, desc_act=True))
        assert w.perm is not None
        full = torch.empty_like(want)
        full[:, perm] = want  # the checkpoint's column perm[j] holds code column j
        want = full
    else:
        v1 = layout == "gptq_v1"
        fmt = "gptq" if v1 else "gptq_v2"
        w = _read(gptq_tensors(codes, zeros, scales, v1=v1), dict(GPTQ, checkpoint_format=fmt))
        assert w.perm is None
    assert torch.equal(w.dequantize(), want)


def test_fused_siblings_stack_along_the_output() -> None:
    parts = []
    wants = []
    for seed in range(3):
        codes, zeros, scales = quantize(_weight(8 * (seed + 1), 64, seed), group=32)
        parts.append(_read(awq_tensors(codes, zeros, scales), AWQ))
        wants.append(dequantize(codes, zeros, scales))
    fused = cat_outputs(parts, "qkv")
    assert torch.equal(fused.dequantize(), torch.cat(wants))


def test_fused_siblings_with_different_orders_are_refused() -> None:
    codes, zeros, scales = quantize(_weight(), group=32)
    plain = _read(gptq_tensors(codes, zeros, scales), GPTQ)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(1))
    ordered = _read(gptq_tensors(codes, zeros, scales, perm=perm), dict(GPTQ, desc_act=True))
    with pytest.raises(ValueError, match=r"qkv: .*activation orders differ"):
        cat_outputs([plain, ordered], "qkv")


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (dict(AWQ, bits=8), "bits=8"),
        (dict(AWQ, version="gemv"), "version 'gemv'"),
        (dict(AWQ, zero_point=False), "zero_point"),
        (dict(GPTQ, group_size=0), "group_size 0"),
        (dict(GPTQ, checkpoint_format="marlin"), "checkpoint_format 'marlin'"),
        ({"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes'"),
    ],
)
def test_unserved_configs_are_refused_naming_the_field(config: dict, field: str) -> None:
    with pytest.raises(Int4ConfigError, match=field):
        parse_int4_config(config, "model/config.json")


def test_a_missing_tensor_is_named() -> None:
    codes, zeros, scales = quantize(_weight(), group=32)
    tensors = awq_tensors(codes, zeros, scales)
    del tensors["qzeros"]
    with pytest.raises(ValueError, match=r"m\.'qzeros'"):
        _read(tensors, AWQ)


def test_misshapen_scales_are_named() -> None:
    codes, zeros, scales = quantize(_weight(), group=32)
    tensors = awq_tensors(codes, zeros, scales)
    tensors["scales"] = tensors["scales"][:1]
    with pytest.raises(ValueError, match="m: scales unpacks to"):
        _read(tensors, AWQ)
