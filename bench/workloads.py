"""Seeded synthetic serving workloads: prompt / output length distributions and arrivals.

A workload draws, per request, a prompt length and an output length (`max_tokens`, sent with
`ignore_eos` so the server generates exactly that many). Prompts are random token ids clear
of the special tokens at the start of the vocabulary, so their length is exact. The same seed
gives the same requests at every rate of a sweep; arrivals at rate R are one seeded sequence
of unit exponential gaps divided by R (a Poisson process), so sweep points differ only in rate.

Named workloads (lengths in tokens, before --max-prompt / --max-output scaling):
  chat       prompt 32..256 (lognormal), output 128..256 (uniform)   short in, long out
  summarize  prompt 512..1536 (uniform), output 16..64 (uniform)     long in, short out
  mix        chat or summarize with probability 1/2 each
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Literal

FIRST_ORDINARY_TOKEN = 100  # ids below are special or byte tokens in common vocabularies

Shape = Literal["uniform", "lognormal"]


@dataclass(frozen=True)
class Lengths:
    """Integer lengths in [low, high]: uniform, or lognormal around the geometric mean
    (about +-2 sigma across the range) clipped to it."""

    low: int
    high: int
    shape: Shape = "uniform"

    def __post_init__(self) -> None:
        if self.low < 1:
            raise ValueError(f"Lengths.low must be >= 1, got {self.low}")
        if self.high < self.low:
            raise ValueError(f"Lengths.high ({self.high}) must be >= low ({self.low})")
        if self.shape not in ("uniform", "lognormal"):
            raise ValueError(f"Lengths.shape must be uniform or lognormal, got {self.shape!r}")

    def sample(self, rng: random.Random) -> int:
        if self.shape == "uniform" or self.low == self.high:
            return rng.randint(self.low, self.high)
        mu = (math.log(self.low) + math.log(self.high)) / 2
        sigma = (math.log(self.high) - math.log(self.low)) / 4
        return min(self.high, max(self.low, round(rng.lognormvariate(mu, sigma))))

    def capped(self, limit: int | None) -> Lengths:
        """Scaled down (both ends, keeping the ratio) so that high <= limit."""
        if limit is None or self.high <= limit:
            return self
        if limit < 1:
            raise ValueError(f"length limit must be >= 1, got {limit}")
        factor = limit / self.high
        return replace(self, low=max(1, math.floor(self.low * factor)), high=limit)


@dataclass(frozen=True)
class Component:
    """One kind of request in a workload and its weight."""

    name: str
    prompt: Lengths
    output: Lengths
    weight: float = 1.0


@dataclass(frozen=True)
class RequestSpec:
    """What one benchmark request sends."""

    index: int
    kind: str
    prompt_ids: list[int]
    max_tokens: int


@dataclass(frozen=True)
class Workload:
    name: str
    components: tuple[Component, ...]

    def __post_init__(self) -> None:
        if not self.components:
            raise ValueError("Workload.components must not be empty")
        if any(c.weight <= 0 for c in self.components):
            raise ValueError("Workload.components weights must be > 0")

    def capped(self, max_prompt: int | None, max_output: int | None) -> Workload:
        comps = tuple(
            replace(c, prompt=c.prompt.capped(max_prompt), output=c.output.capped(max_output))
            for c in self.components
        )
        return replace(self, components=comps)

    def sample(self, n: int, seed: int, vocab_size: int) -> list[RequestSpec]:
        """`n` requests, the same for the same (n, seed, vocab_size)."""
        if vocab_size <= FIRST_ORDINARY_TOKEN:
            raise ValueError(f"vocab_size must be > {FIRST_ORDINARY_TOKEN}, got {vocab_size}")
        rng = random.Random(seed)
        weights = [c.weight for c in self.components]
        specs = []
        for i in range(n):
            comp = rng.choices(self.components, weights)[0]
            length = comp.prompt.sample(rng)
            ids = [rng.randrange(FIRST_ORDINARY_TOKEN, vocab_size) for _ in range(length)]
            specs.append(RequestSpec(i, comp.name, ids, comp.output.sample(rng)))
        return specs


_CHAT = Component("chat", Lengths(32, 256, "lognormal"), Lengths(128, 256))
_SUMMARIZE = Component("summarize", Lengths(512, 1536), Lengths(16, 64))

WORKLOADS: dict[str, Workload] = {
    "chat": Workload("chat", (_CHAT,)),
    "summarize": Workload("summarize", (_SUMMARIZE,)),
    "mix": Workload("mix", (_CHAT, _SUMMARIZE)),
}


def get_workload(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; choose from {sorted(WORKLOADS)}") from None


def poisson_arrivals(n: int, rate: float | None, seed: int) -> list[float]:
    """Send times (s from the start) of `n` requests at `rate` req/s; None: all at once."""
    if rate is None:
        return [0.0] * n
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    rng = random.Random(seed)
    times, t = [], 0.0
    for _ in range(n):  # the first request goes at once, so a point's clock starts with it
        times.append(t / rate)
        t += rng.expovariate(1.0)
    return times


def arrivals_within(duration_s: float, rate: float, seed: int) -> int:
    """How many requests of a Poisson stream at `rate` arrive within `duration_s`."""
    if rate <= 0 or duration_s <= 0:
        raise ValueError(f"rate and duration must be > 0, got {rate} and {duration_s}")
    rng = random.Random(seed)
    n, t = 0, 0.0
    while t / rate < duration_s:
        n += 1
        t += rng.expovariate(1.0)
    return n
