"""Pooling (embeddings): the engine's pooled vector equals the one computed from
transformers' hidden states of the same model, for last-token and mean pooling, across
chunks; bad input is refused; no KV block stays taken."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_llama import save_tiny_llama
from transformers import LlamaForCausalLM

from engine.config import EngineConfig, Role
from engine.engine import LLMEngine
from engine.pooling import NoRoom, PoolingParams
from models.sampling_params import SamplingParams

PROMPT = [5, 9, 17, 33, 4, 8, 12, 40, 41, 42, 3, 77, 90]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LlamaForCausalLM]:
    path = tmp_path_factory.mktemp("tiny-llama")
    return path, save_tiny_llama(path)


def _engine(model_dir: Path, **kw: object) -> LLMEngine:
    torch.set_num_threads(1)
    config = EngineConfig(
        model_dir=model_dir, block_size=4, num_kv_blocks=64, role=Role.PREFILL, **kw
    )
    return LLMEngine(config)


def hf_pooled(model: LlamaForCausalLM, ids: list[int], params: PoolingParams) -> torch.Tensor:
    """The oracle: transformers' last hidden state (after the final norm), pooled."""
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    h = out.hidden_states[-1][0].float()  # [tokens, hidden]
    v = h[-1] if params.pooling == "last" else h.mean(0)
    return torch.nn.functional.normalize(v, dim=0) if params.normalize else v


@pytest.mark.parametrize("pooling", ["last", "mean"])
@pytest.mark.parametrize("chunk", [2048, 5])  # one pass; chunks of 5 attending to earlier ones
def test_pooled_vector_matches_transformers(
    tiny: tuple[Path, LlamaForCausalLM], pooling: str, chunk: int
) -> None:
    path, model = tiny
    engine = _engine(path, max_num_batched_tokens=chunk, enable_chunked_prefill=True)
    free = engine.block_manager.num_free_blocks
    for normalize in (True, False):
        params = PoolingParams(pooling, normalize)  # type: ignore[arg-type]
        got = torch.tensor(engine.embed("e", PROMPT, params))
        want = hf_pooled(model, PROMPT, params)
        assert torch.nn.functional.cosine_similarity(got, want, dim=0) > 0.9999
        assert torch.allclose(got, want, rtol=1e-3, atol=1e-3)
    assert engine.block_manager.num_free_blocks == free


def test_bad_input_is_refused_and_nothing_leaks(tiny: tuple[Path, LlamaForCausalLM]) -> None:
    engine = _engine(tiny[0])
    free = engine.block_manager.num_free_blocks
    held = engine.block_manager.num_free_blocks - 16
    engine.add_request("held", [3] * (16 * 4 - 1), SamplingParams(max_tokens=5, ignore_eos=True))
    engine.step()  # the prefill role pins its 16 blocks
    assert engine.block_manager.num_free_blocks == held
    with pytest.raises(ValueError, match="token ids"):
        engine.embed("e", [1, 10_000], PoolingParams())
    with pytest.raises(ValueError, match="token ids"):
        engine.embed("e", [], PoolingParams())
    with pytest.raises(ValueError, match="pooling"):
        PoolingParams("cls")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="context length"):
        engine.embed("e", list(range(3, 100)) * 3, PoolingParams())  # 291 tokens > 256
    with pytest.raises(NoRoom, match="KV blocks"):
        engine.embed("e", list(range(3, 100)) * 2, PoolingParams())  # 49 blocks > 64 - 16
    assert engine.block_manager.num_free_blocks == held
    engine.release("held")
    assert engine.block_manager.num_free_blocks == free
