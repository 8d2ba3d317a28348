"""AWQ, GPTQ (with and without activation order) and FP8 (tensor, channel and tile scales)
checkpoints of a tiny Llama: the engine's greedy tokens equal transformers' running the
dequantized weights, with the int4 matrices kept packed; bad checkpoints are refused by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from quant_checkpoints import SCHEMES, save_quantized
from safetensors.torch import load_file, save_file

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.model.quant.weight import QuantWeight
from models.sampling_params import SamplingParams
from tests.engine.model.tiny_families import hf_greedy
from tests.engine.tiny_llama import save_tiny_llama

PROMPTS = [[1, 17, 33, 5, 90, 12, 44, 8, 61, 23, 77, 3], [1, 5, 9, 14, 120, 64, 32, 16, 8]]
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Path]]:
    out = {}
    for scheme in SCHEMES:
        path = tmp_path_factory.mktemp(scheme)
        model = save_tiny_llama(path, seed=3)
        save_quantized(model, path, scheme)
        out[scheme] = (model, path)
    return out


def _engine(path: Path, **kw: Any) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model_dir=path, dtype="float32", block_size=4, num_kv_blocks=64,
            max_num_batched_tokens=16, **kw,
        )
    )  # fmt: skip


def _greedy(engine: LLMEngine) -> list[list[int]]:
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, params)
    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(PROMPTS))}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    return [tokens[str(i)] for i in range(len(PROMPTS))]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_greedy_equals_transformers_on_the_dequantized_weights(
    checkpoints: dict[str, tuple[Any, Path]], scheme: str
) -> None:
    hf, path = checkpoints[scheme]
    expected = [hf_greedy(hf, p, NEW_TOKENS) for p in PROMPTS]
    engine = _engine(path)
    assert _greedy(engine) == expected
    layer = engine.runner.model.decoder_layers()[0]
    if not scheme.startswith("fp8"):  # int4 stays packed on the CPU; fp8 is unpacked there
        assert isinstance(layer.attn.packed["qkv"], QuantWeight)
        assert isinstance(layer.mlp.packed["down"], QuantWeight)
        assert layer.attn.qkv.is_meta  # no fp32 copy kept


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("scheme", SCHEMES)
def test_on_the_gpu_the_triton_gemms_equal_transformers(
    checkpoints: dict[str, tuple[Any, Path]], scheme: str
) -> None:
    """On CUDA the matrices stay quantized (Triton w4a16 / fp8 GEMMs, fp32 activations):
    greedy tokens equal transformers' on the dequantized weights."""
    from engine.model.quant.gpu_weight import Fp8GpuWeight, Int4GpuWeight

    hf, path = checkpoints[scheme]
    expected = [hf_greedy(hf, p, NEW_TOKENS) for p in PROMPTS]
    engine = _engine(path, device="cuda")
    assert _greedy(engine) == expected
    kind = Fp8GpuWeight if scheme.startswith("fp8") else Int4GpuWeight
    layer = engine.runner.model.decoder_layers()[0]
    assert isinstance(layer.attn.packed["qkv"], kind)
    assert isinstance(layer.mlp.packed["down"], kind)


def test_int4_weights_take_an_eighth_of_fp32(checkpoints: dict[str, tuple[Any, Path]]) -> None:
    _, path = checkpoints["awq"]
    quantized = _engine(path).runner.model
    _, plain_path = checkpoints["fp8_tensor"]  # same shapes, fp32 in memory on the CPU
    plain = _engine(plain_path).runner.model
    linear = sum(q.nbytes for q in quantized.quantized_weights())
    fp32_linear = plain.weight_bytes()[0] - quantized.weight_bytes()[0] + linear
    assert linear < fp32_linear / 5  # 4-bit codes plus a scale and a min per 32


def test_another_quantization_than_the_checkpoints_is_refused(
    checkpoints: dict[str, tuple[Any, Path]],
) -> None:
    _, path = checkpoints["awq"]
    with pytest.raises(ValueError, match=r"awq-quantized .* quantization 'gptq' cannot load it"):
        _engine(path, quantization="gptq")


def test_an_unknown_method_is_named(tmp_path: Path) -> None:
    save_tiny_llama(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="quant_method 'bitsandbytes' is not supported"):
        _engine(tmp_path)


def test_a_missing_quantized_tensor_is_named(
    checkpoints: dict[str, tuple[Any, Path]], tmp_path: Path
) -> None:
    _, path = checkpoints["gptq"]
    for f in path.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(tmp_path / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.qzeros"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.'qzeros'"):
        _engine(tmp_path)


def test_fp8_codes_of_another_dtype_are_named(
    checkpoints: dict[str, tuple[Any, Path]], tmp_path: Path
) -> None:
    _, path = checkpoints["fp8_tensor"]
    for f in path.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(tmp_path / "model.safetensors"))
    name = "model.layers.0.self_attn.o_proj.weight"
    tensors[name] = tensors[name].to(torch.float16)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"o_proj\.weight is torch\.float16"):
        _engine(tmp_path)
