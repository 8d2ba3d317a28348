"""The `multiturn` serving workload: many users, each a conversation that grows.

Every user starts from the same system prompt; turn k's prompt is the system prompt, every
earlier question and answer, and a new question, so a conversation soon outgrows the system
prompt (with the defaults, turn 8 averages about 1,450 tokens, of which 128 are the system
prompt). The answers in later prompts are seeded stand-ins of the length the server was asked
to generate (`ignore_eos`), so every policy and run sees the same prompts whatever the model
said; a decode node's cache thus matches the previous prompt of a conversation, not its
answer, where a real client's re-sent answer would match most of it. Conversations start as
a Poisson process at the offered rate (conversations per second); inside one, a user sends
the next turn a seeded think time (exponential, mean --think-time) after the previous answer
ended, so conversations interleave. Prompts are token ids clear of the special tokens, as in
bench/workloads.py.

Beyond the usual latencies it counts prompt tokens the server computed (prompt minus the
`cached_tokens` the usage reports): the work a prefix cache, and routing to it, saves.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from dataclasses import dataclass
from typing import Any

import httpx
from tqdm import tqdm

from bench.serve_client import Clock, LoadOptions, PointRun, RequestRecord, Target, stream_one
from bench.workloads import FIRST_ORDINARY_TOKEN, Lengths, RequestSpec, poisson_arrivals

# Per-turn lengths in tokens. The LMSYS-Chat-1M paper (real chats with 25 LLMs) reports
# about 70 tokens per user message and 215 per answer, both right-skewed. Questions are drawn
# lognormal in 16..192 (mean 66, median 55); answers lognormal in 32..256 (mean 102, median
# 90): half the real mean, because a CPU decodes at about 10 tokens/s per request and each
# turn waits for the previous answer (ask for real lengths with --answer-tokens
# 64:384:lognormal: mean 172).
_QUESTION = Lengths(16, 192, "lognormal")
_ANSWER = Lengths(32, 256, "lognormal")


def parse_lengths(text: str) -> Lengths:
    """`LOW:HIGH` (uniform) or `LOW:HIGH:lognormal`, e.g. 64:384:lognormal."""
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError("expected LOW:HIGH or LOW:HIGH:SHAPE")
        shape = parts[2] if len(parts) == 3 else "uniform"
        if shape == "lognormal":
            return Lengths(int(parts[0]), int(parts[1]), "lognormal")
        if shape != "uniform":
            raise ValueError(f"shape must be uniform or lognormal, got {shape!r}")
        return Lengths(int(parts[0]), int(parts[1]))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad lengths {text!r}: {exc}") from None


def format_lengths(lengths: Lengths) -> str:
    return f"{lengths.low}:{lengths.high}:{lengths.shape}"


@dataclass(frozen=True)
class Multiturn:
    """The shape of the conversations (lengths in tokens)."""

    users: int = 10
    turns: int = 8
    system: int = 128
    question: Lengths = _QUESTION
    answer: Lengths = _ANSWER
    think_s: float = 1.0

    def __post_init__(self) -> None:
        for name in ("users", "turns", "system"):
            if getattr(self, name) < 1:
                raise ValueError(f"Multiturn.{name} must be >= 1, got {getattr(self, name)}")
        if self.think_s < 0:
            raise ValueError(f"Multiturn.think_s must be >= 0, got {self.think_s}")

    def conversations(self, seed: int, vocab_size: int) -> list[list[RequestSpec]]:
        """Per user, its turns in order; request index = user * turns + turn."""
        rng = random.Random(seed)

        def ids(n: int) -> list[int]:
            return [rng.randrange(FIRST_ORDINARY_TOKEN, vocab_size) for _ in range(n)]

        system = ids(self.system)
        out = []
        for user in range(self.users):
            history, turns = list(system), []
            for turn in range(self.turns):
                prompt = history + ids(self.question.sample(rng))
                max_tokens = self.answer.sample(rng)
                index = user * self.turns + turn
                turns.append(RequestSpec(index, f"turn{turn + 1}", prompt, max_tokens))
                history = prompt + ids(max_tokens)
            out.append(turns)
        return out

    def think_times(self, seed: int) -> list[list[float]]:
        rng = random.Random(seed + 7)
        mean = self.think_s
        return [
            [rng.expovariate(1 / mean) if mean > 0 else 0.0 for _ in range(self.turns)]
            for _ in range(self.users)
        ]


async def run_conversations(
    target: Target, shape: Multiturn, seed: int, vocab_size: int, rate: float | None,
    opts: LoadOptions, desc: str,
) -> PointRun:  # fmt: skip
    """Every conversation of `shape`, started at `rate` per second (None: all at once)."""
    convs = shape.conversations(seed, vocab_size)
    starts = poisson_arrivals(len(convs), rate, seed)
    thinks = shape.think_times(seed)
    bar = tqdm(total=shape.users * shape.turns, desc=desc, unit="req", file=sys.stderr,
               disable=not opts.progress)  # fmt: skip
    clock = Clock()
    limits = httpx.Limits(max_keepalive_connections=shape.users)
    async with httpx.AsyncClient(timeout=opts.timeout_s, limits=limits) as client:

        async def user(turns: list[RequestSpec], start: float, pauses: list[float]) -> list[Any]:
            await asyncio.sleep(max(0.0, start - clock.now()))
            records = []
            for spec, pause in zip(turns, pauses, strict=True):
                at = clock.now()
                records.append(await stream_one(client, target, spec, clock, at, opts.timeout_s))
                bar.update(1)
                await asyncio.sleep(pause)
            return records

        per_user = await asyncio.gather(
            *(user(t, s, p) for t, s, p in zip(convs, starts, thinks, strict=True))
        )
    bar.close()
    records: list[RequestRecord] = sorted((r for rs in per_user for r in rs), key=lambda r: r.id)
    return PointRun(records, max((r.end for r in records), default=0.0))


def prefix_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Prompt tokens sent, taken from caches and computed, over the successful requests."""
    ok = [r for r in records if r["error"] is None]
    prompt = sum(r["prompt_tokens"] for r in ok)
    cached = sum(r.get("cached_tokens") or 0 for r in ok)
    return {
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "computed_prompt_tokens": prompt - cached,
        "cached_ratio": cached / prompt if prompt else 0.0,
    }
