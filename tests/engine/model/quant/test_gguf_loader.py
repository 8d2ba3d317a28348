"""GGUF checkpoints load packed and compute what transformers computes on the weights the
GGUF holds: greedy tokens equal, for each quantized type and a mix of them in one matrix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as T

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.model.quant.weight import QuantWeight
from tests.engine.model.quant.tiny_gguf import save_tiny_gguf
from tests.engine.model.test_families import NEW_TOKENS, PROMPTS, engine_greedy
from tests.engine.model.tiny_families import hf_greedy


def _q4_k_m(name: str) -> T:
    """Like llama.cpp's Q4_K_M: v and down in Q6_K, the embedding in Q8_0, the rest Q4_K
    (so the fused qkv mixes a 4-bit type with an 8-bit one of another group size)."""
    if "v_proj" in name or "down_proj" in name:
        return T.Q6_K
    return T.Q8_0 if "embed" in name else T.Q4_K


TYPES = {t.name: (lambda _, t=t: t) for t in (T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q5_K, T.Q6_K)}
TYPES["Q4_K_M"] = _q4_k_m


@pytest.mark.parametrize("kind", list(TYPES))
def test_greedy_equals_transformers_on_the_gguf_weights(tmp_path: Path, kind: str) -> None:
    hf = save_tiny_gguf(tmp_path, TYPES[kind])
    expected = [hf_greedy(hf, p, NEW_TOKENS) for p in PROMPTS]
    assert engine_greedy(tmp_path, PROMPTS, quantization="gguf") == expected


def test_the_torch_path_computes_the_same(tmp_path: Path) -> None:
    hf = save_tiny_gguf(tmp_path, _q4_k_m)
    expected = [hf_greedy(hf, p, NEW_TOKENS) for p in PROMPTS]
    torch_path = {"cpu_kernels": False, "pack_cpu_weights": False, "attention_backend": "torch"}
    assert engine_greedy(tmp_path, PROMPTS, quantization="gguf", **torch_path) == expected


def test_weights_stay_packed(tmp_path: Path) -> None:
    save_tiny_gguf(tmp_path, lambda _: T.Q4_1)
    config = EngineConfig(model_dir=tmp_path, num_kv_blocks=16, quantization="gguf")
    model = LLMEngine(config).runner.model
    total, _ = model.weight_bytes()
    matrices = sum(q.out_features * q.in_features for q in model.quantized_weights())
    # 4-bit codes, fp16 scale and min per 32 (Q4_1's own, exact in fp16): 5 bits a weight,
    # as in the GGUF; the norms are few
    assert matrices * 5 / 8 <= total < matrices * 5 / 8 * 1.05
    packed = model.quantized_weights()
    assert all(isinstance(q, QuantWeight) and q.scales.dtype == torch.float16 for q in packed)
    assert all(p.is_meta for p in (model.embed, model.layers[0].attn.qkv))


def _load(path: Path) -> LLMEngine:
    return LLMEngine(EngineConfig(model_dir=path, num_kv_blocks=16, quantization="gguf"))


def test_an_unsupported_type_is_refused_naming_file_and_tensor(tmp_path: Path) -> None:
    save_tiny_gguf(tmp_path, lambda name: T.Q5_0 if "layers.1.mlp.up" in name else T.Q8_0)
    with pytest.raises(
        ValueError, match=r"tiny\.gguf: tensor 'blk\.1\.ffn_up\.weight' has type Q5_0"
    ):
        _load(tmp_path)


def test_a_missing_tensor_is_refused(tmp_path: Path) -> None:
    save_tiny_gguf(tmp_path, lambda _: T.Q8_0, drop=("model.layers.0.self_attn.k_proj.weight",))
    with pytest.raises(
        ValueError, match=r"tiny\.gguf: GGUF lacks tensor 'model\.layers\.0\.self_attn\.k_proj"
    ):
        _load(tmp_path)


def test_a_tensor_of_another_shape_is_refused(tmp_path: Path) -> None:
    (tmp_path / "wide").mkdir()
    save_tiny_gguf(tmp_path / "wide", lambda _: T.Q8_0, intermediate_size=768)
    save_tiny_gguf(tmp_path, lambda _: T.Q8_0)
    (tmp_path / "wide" / "tiny.gguf").replace(tmp_path / "tiny.gguf")
    with pytest.raises(
        ValueError, match=r"tiny\.gguf: tensor 'blk\.0\.ffn_gate\.weight' has shape"
    ):
        _load(tmp_path)


def test_not_a_gguf_file_is_refused(tmp_path: Path) -> None:
    save_tiny_gguf(tmp_path, lambda _: T.Q8_0)
    (tmp_path / "tiny.gguf").write_bytes(b"not a gguf at all")
    with pytest.raises(ValueError, match=r"tiny\.gguf: not a valid GGUF file: it starts with"):
        _load(tmp_path)


def test_a_truncated_gguf_is_refused_naming_the_tensor_cut(tmp_path: Path) -> None:
    save_tiny_gguf(tmp_path, lambda _: T.Q8_0)
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(gguf.read_bytes()[:-5000])
    with pytest.raises(ValueError, match=r"tiny\.gguf: not a valid GGUF file: tensor '.*' ends "
                       r"at byte \d+, past the end of the file"):  # fmt: skip
        _load(tmp_path)


def test_loading_reads_the_tensor_table_without_parsing_the_metadata_arrays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gguf package's reader parses every metadata item (a 49k-token vocabulary: most of
    a node's start); the loader reads only the tensor table (models.gguf_header)."""
    import gguf

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("GGUFReader parses the whole metadata")

    save_tiny_gguf(tmp_path, lambda _: T.Q4_1)
    monkeypatch.setattr(gguf, "GGUFReader", refuse)
    assert _load(tmp_path).runner.model.quantized_weights()
