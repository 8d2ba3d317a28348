"""A tiny random-weight Llama saved as a HF directory, and helpers to drive the runner.

transformers is the oracle here; it never runs inside the engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine.config import EngineConfig
from engine.model.config import ModelConfig
from engine.scheduler.plan import ScheduledChunk, SchedulerOutput
from engine.step.runner import ModelRunner

TINY: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
# Where the Triton backend tests run: on the GPU when there is one (Triton takes only CUDA
# tensors there), else on CPU tensors under the interpreter (TRITON_INTERPRET=1, conftest.py).
TRITON_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # small, so that the 16-dim heads have frequencies kept, blended and slowed
    "original_max_position_embeddings": 64,
}


def save_tiny_llama(path: Path, seed: int = 0, **overrides: Any) -> LlamaForCausalLM:
    """Save a random Llama (weights large enough that wrong math shows) and return it."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**(TINY | overrides))).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() == 1:  # norm weights
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    model.save_pretrained(path)
    return model


def save_tiny_text_model(path: Path, **overrides: Any) -> None:
    """A tiny random Llama with the byte tokenizer (tiny_tokenizer): a directory that
    ``LLM(...)`` loads and takes text prompts for."""
    from tiny_tokenizer import VOCAB, save_byte_tokenizer

    save_tiny_llama(path, vocab_size=VOCAB, **overrides)
    save_byte_tokenizer(path)


def hf_logits(model: LlamaForCausalLM, token_ids: list[int]) -> torch.Tensor:
    """[len, vocab] fp32 logits of every position."""
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float()


def make_runner(model_dir: Path, dtype: str = "float32", **kw: Any) -> ModelRunner:
    config = EngineConfig(model_dir=model_dir, dtype=dtype, block_size=4, num_kv_blocks=64, **kw)
    return ModelRunner(config, ModelConfig.from_dir(model_dir))


def chunk(
    rid: str,
    tokens: list[int],
    start: int,
    end: int,
    table: tuple[int, ...],
    sample: bool = True,
) -> ScheduledChunk:
    """Positions ``start .. end - 1`` of ``tokens``."""
    return ScheduledChunk(rid, tuple(tokens[start:end]), start, table, sample)


def step(runner: ModelRunner, *chunks: ScheduledChunk) -> torch.Tensor:
    return runner.execute(SchedulerOutput(tuple(chunks)))
