"""An AWQ, GPTQ or FP8 checkpoint of ``Gemma3ForConditionalGeneration`` (its text model's
tensors under ``language_model``, a vision tower beside them, quantized too) loads its text
model: greedy tokens equal transformers' image-text model on the dequantized weights, the
int4 matrices kept packed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from quant_checkpoints import save_quantized
from safetensors import safe_open

from engine.model.quant.weight import QuantWeight
from tests.engine.model.test_families import NEW_TOKENS, PROMPTS, engine_greedy
from tests.engine.model.test_mla import engine_of
from tests.engine.model.tiny_families import hf_greedy, save_gemma3_vision


@pytest.mark.parametrize("scheme", ["awq", "gptq_act_order", "fp8_block"])
def test_a_quantized_image_text_checkpoint_serves_its_text_model(
    tmp_path: Path, scheme: str
) -> None:
    hf = save_gemma3_vision(tmp_path, seed=2)
    save_quantized(hf, tmp_path, scheme)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    assert any(n.startswith("model.language_model.layers.0.self_attn.q_proj.") for n in names)
    assert any(n.startswith("model.vision_tower.") and "q_proj" in n for n in names)
    expected = [hf_greedy(hf, p, NEW_TOKENS) for p in PROMPTS]
    assert engine_greedy(tmp_path, PROMPTS) == expected
    if not scheme.startswith("fp8"):  # int4 stays packed on the CPU
        layer: Any = engine_of(tmp_path).runner.model.decoder_layers()[0]
        assert isinstance(layer.attn.packed["qkv"], QuantWeight) and layer.attn.qkv.is_meta
