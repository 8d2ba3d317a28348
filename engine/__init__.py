"""The inference engine: decoder-only models of the families in engine.model.families (Llama,
Mistral, Mixtral, Qwen2/3 and their MoE, Phi-3, Gemma 2/3) over a paged KV cache, continuous
batching.

`from engine import LLM, SamplingParams`. Names load lazily so that importing one engine
module (say engine.config) does not load the model code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.config import EngineConfig, Role
    from engine.engine import LLMEngine
    from engine.llm import LLM
    from engine.lora.request import LoRARequest
    from engine.outputs import GenerationOutput, RequestOutput, TokenLogprob
    from models.sampling_params import SamplingParams

_EXPORTS = {
    "LLM": "engine.llm",
    "LLMEngine": "engine.engine",
    "LoRARequest": "engine.lora.request",
    "EngineConfig": "engine.config",
    "Role": "engine.config",
    "SamplingParams": "models.sampling_params",
    "GenerationOutput": "engine.outputs",
    "RequestOutput": "engine.outputs",
    "TokenLogprob": "engine.outputs",
}

__all__ = [
    "LLM",
    "EngineConfig",
    "GenerationOutput",
    "LLMEngine",
    "LoRARequest",
    "RequestOutput",
    "Role",
    "SamplingParams",
    "TokenLogprob",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
