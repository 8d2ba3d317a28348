"""Offline generation: `LLM(model_dir).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from engine.config import engine_config
from engine.engine import LLMEngine
from engine.lora.request import LoRARequest
from engine.outputs import GenerationOutput, TokenLogprob
from engine.scheduler.request import FinishReason
from models import IncrementalDetokenizer, Tokenizer
from models.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    """A model loaded into one engine, for batch generation in this process.

    Text prompts are tokenized as they are (no chat template); `chat` applies the model's
    chat template. Extra keyword arguments go to EngineConfig (block_size, num_kv_blocks,
    max_num_batched_tokens, ...); what is not given takes the device's default
    (engine.config.engine_config).

    `close()` (or leaving a `with LLM(...) as llm:` block) stops the engine: its KV tiers'
    copies finished, a multi-rank engine's ranks stopped, so that the process can start
    another. An `LLM` that is no longer referenced is closed when it is collected.
    """

    def __init__(
        self,
        model_dir: str | Path,
        dtype: str | torch.dtype = "float32",
        device: str = "cpu",
        **engine_kwargs: Any,
    ) -> None:
        config = engine_config(Path(model_dir), device=device, dtype=dtype, **engine_kwargs)
        self.tokenizer = Tokenizer.from_dir(config.model_dir)
        self.engine = LLMEngine(config)
        self._ids = itertools.count()
        # not at exit: a process that ends takes its ranks with it (engine.parallel.watchdog)
        self._closer = weakref.finalize(self, self.engine.close)
        self._closer.atexit = False

    def close(self) -> None:
        """Finish the KV tiers' copies (their disk files written) and stop their thread; stop
        a multi-rank engine's ranks. Once only: later calls do nothing."""
        self._closer()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def generate(
        self,
        prompts: Sequence[Prompt] | Prompt,
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[GenerationOutput]:
        """Generate for every prompt in one continuous batch; results in prompt order.
        `lora_request`: the adapter of every prompt, or one per prompt (None: the base model);
        adapters need ``enable_lora=True``."""
        batch = _as_batch(prompts)
        param_list = _broadcast(params, len(batch))
        loras = _broadcast_loras(lora_request, len(batch))
        token_lists = [self._encode(p) for p in batch]
        ids = [f"offline-{next(self._ids)}" for _ in batch]
        for rid, tokens, sp, lora in zip(ids, token_lists, param_list, loras, strict=True):
            self.engine.add_request(rid, tokens, sp, lora=lora)
        generated: dict[str, list[int]] = {rid: [] for rid in ids}
        logprobs: dict[str, list[TokenLogprob]] = {rid: [] for rid in ids}
        reasons: dict[str, FinishReason | None] = {}
        try:
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    generated[out.request_id].extend(out.new_token_ids)
                    logprobs[out.request_id].extend(out.logprobs)
                    if out.finished:
                        reasons[out.request_id] = out.finish_reason
        finally:
            for rid in ids:
                if rid not in reasons:
                    self.engine.abort(rid)
        return [
            GenerationOutput(
                prompt_token_ids=tokens,
                token_ids=generated[rid],
                text=self._detokenize(tokens, generated[rid]),
                finish_reason=reasons.get(rid),
                logprobs=logprobs[rid] if sp.logprobs is not None else None,
            )
            for rid, tokens, sp in zip(ids, token_lists, param_list, strict=True)
        ]

    def chat(
        self,
        conversations: Sequence[list[dict[str, str]]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[GenerationOutput]:
        """Apply the chat template to each conversation, then generate (``lora_request`` as
        ``generate`` takes it)."""
        prompts = [self.tokenizer.apply_chat_template(list(c)) for c in conversations]
        return self.generate(prompts, params, lora_request)

    def _encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        return list(prompt)

    def _detokenize(self, prompt: list[int], tokens: list[int]) -> str:
        detok = IncrementalDetokenizer(self.tokenizer, prompt_ids=prompt)
        return "".join(detok.add(t) for t in tokens) + detok.flush()


def _as_batch(prompts: Sequence[Prompt] | Prompt) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    items = list(prompts)
    if items and all(isinstance(t, int) for t in items):
        return [list(items)]  # type: ignore[arg-type]
    return items  # type: ignore[return-value]


def _broadcast_loras(
    loras: LoRARequest | Sequence[LoRARequest | None] | None, n: int
) -> list[LoRARequest | None]:
    if loras is None or isinstance(loras, LoRARequest):
        return [loras] * n
    if len(loras) != n:
        raise ValueError(f"got {len(loras)} LoRA requests for {n} prompts")
    return list(loras)


def _broadcast(
    params: SamplingParams | Sequence[SamplingParams] | None, n: int
) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    if len(params) != n:
        raise ValueError(f"got {len(params)} SamplingParams for {n} prompts")
    return list(params)
