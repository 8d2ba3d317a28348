"""The engine's offline output for the prompts the end-to-end tests send."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.llm import LLM
from models.sampling_params import SamplingParams


@dataclass(frozen=True)
class Expected:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


class Oracle:
    """Greedy offline generation, one batch per call, for chats and raw text prompts."""

    def __init__(self, model_dir: Path) -> None:
        self.llm = LLM(model_dir, num_kv_blocks=512)

    def chat(
        self, conversations: Sequence[list[dict[str, str]]], max_tokens: int
    ) -> list[Expected]:
        prompts = [self.llm.tokenizer.apply_chat_template(c, True) for c in conversations]
        return self._run(prompts, max_tokens)

    def complete(self, prompts: Sequence[str], max_tokens: int) -> list[Expected]:
        return self._run([self.llm.tokenizer.encode(p, True) for p in prompts], max_tokens)

    def _run(self, prompts: list[list[int]], max_tokens: int) -> list[Expected]:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        outs = self.llm.generate(prompts, params)
        return [
            Expected(o.text, len(o.prompt_token_ids), len(o.token_ids), str(o.finish_reason))
            for o in outs
        ]
