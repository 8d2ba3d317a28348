"""Per-request sampling parameters, validated at construction.

The one sampling type of the project: the router builds it from the OpenAI request, the wire
protocol (cluster.protocol) carries it as it is, and the engine samples with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop. Invalid values raise InvalidSampling (a
    ValueError) naming the field.

    `max_tokens` counts ALL output tokens of the request, including the ones a decode request
    passes in `output_token_ids`.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    logprobs: int | None = None  # None = off; 0 = sampled token only; n = also top-n
    # (token id, bias) pairs added to the logits before sampling, as OpenAI's logit_bias
    logit_bias: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    # an llguidance grammar (JSON text) the output must match (engine.sampling.grammar); None = free
    grammar: str | None = None

    def __post_init__(self) -> None:
        _check(
            _is_int(self.max_tokens) and self.max_tokens >= 1,
            "max_tokens",
            f"must be an integer >= 1, got {self.max_tokens!r}",
        )
        _check(
            math.isfinite(self.temperature) and self.temperature >= 0.0,
            "temperature",
            f"must be a finite number >= 0, got {self.temperature!r}",
        )
        _check(0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p!r}")
        _check(
            _is_int(self.top_k) and self.top_k >= 0,
            "top_k",
            f"must be an integer >= 0 (0 = off), got {self.top_k!r}",
        )
        _check(0.0 <= self.min_p <= 1.0, "min_p", f"must be in [0, 1], got {self.min_p!r}")
        _check(
            -2.0 <= self.presence_penalty <= 2.0,
            "presence_penalty",
            f"must be in [-2, 2], got {self.presence_penalty!r}",
        )
        _check(
            -2.0 <= self.frequency_penalty <= 2.0,
            "frequency_penalty",
            f"must be in [-2, 2], got {self.frequency_penalty!r}",
        )
        _check(
            self.repetition_penalty > 0.0,
            "repetition_penalty",
            f"must be > 0, got {self.repetition_penalty!r}",
        )
        _check(
            self.seed is None or isinstance(self.seed, int),
            "seed",
            f"must be an integer, got {self.seed!r}",
        )
        _check(
            all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids",
            f"must be non-negative integers, got {self.stop_token_ids!r}",
        )
        _check(
            self.logprobs is None or (isinstance(self.logprobs, int) and 0 <= self.logprobs <= 20),
            "logprobs",
            f"must be an integer in [0, 20], got {self.logprobs!r}",
        )
        try:
            bias = tuple((t, float(b)) for t, b in self.logit_bias)
        except (TypeError, ValueError):
            bias = ((-1, 0.0),)  # not pairs: refused below
        _check(
            all(_is_int(t) and t >= 0 and -100.0 <= b <= 100.0 for t, b in bias),
            "logit_bias",
            f"must be (token id >= 0, bias in [-100, 100]) pairs, got {self.logit_bias!r}",
        )
        _check(
            self.grammar is None or (isinstance(self.grammar, str) and bool(self.grammar)),
            "grammar",
            "must be None or a non-empty llguidance grammar string",
        )
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "logit_bias", bias)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )


class InvalidSampling(ValueError):
    """A SamplingParams field out of its bounds; `field` names it (the wire protocol reports
    it as the error's location)."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"SamplingParams.{name} {message}")
        self.field = name


def _check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise InvalidSampling(name, message)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
