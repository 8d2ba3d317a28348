"""The requests a chaos run sends: a seeded mix of chat and text completions, streamed or not,
n of 1 to 3, short prompts (prefilled on the decode node), long ones (through the prefill
pool) and prompts that share a long preamble, all greedy, with logprobs (and the best two
alternatives) so that every answer names its tokens and how close each choice was."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

MODEL = "smollm2"
TOP = 2  # alternatives asked for each token: a near-tie shows in them
_ADJ = ("quiet", "old", "bright", "narrow", "golden", "patient", "sudden", "distant", "heavy",
        "gentle", "clever", "broken", "early", "silver", "curious", "humble", "rapid")  # fmt: skip
_NOUN = ("river", "lighthouse", "baker", "engine", "garden", "letter", "mountain", "window",
         "sailor", "clock", "library", "forest", "teacher", "bridge", "market")  # fmt: skip
_VERB = ("watched", "carried", "painted", "repaired", "followed", "counted", "visited",
         "answered", "described", "measured", "borrowed", "remembered")  # fmt: skip
PREAMBLE = (
    "You are a careful assistant for a small coastal town. You answer in plain words, you "
    "never invent facts about the town, and you keep every answer short. The town has a "
    "harbor, a lighthouse, a market on Saturdays, a library that opens at nine, and a "
    "bakery that sells bread before sunrise. Visitors often ask about the ferry, the "
    "weather, and the old stories that the fishermen tell in the evening."
)


@dataclass(frozen=True)
class Spec:
    """One request: its endpoint, body and how it is read."""

    index: int
    chat: bool
    stream: bool
    n: int
    body: dict[str, Any] = field(hash=False)

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.chat else "/v1/completions"

    def with_timeout(self, timeout_s: float) -> dict[str, Any]:
        """The body with the router's per-request deadline (its `timeout` extension)."""
        return {**self.body, "timeout": timeout_s}


def _sentence(rng: random.Random) -> str:
    a, b = rng.sample(_ADJ, 2)
    n1, n2 = rng.sample(_NOUN, 2)
    return f"The {a} {n1} {rng.choice(_VERB)} the {b} {n2}."


def _text(rng: random.Random, sentences: int) -> str:
    return " ".join(_sentence(rng) for _ in range(sentences))


def _prompt(rng: random.Random) -> tuple[str, str | None]:
    """(question, preamble or None): short (under the router's local-prefill limit of 32
    tokens), medium (about 40 to 110 tokens) or long (about 170 to 280); half of the others
    share the preamble (about 90 tokens)."""
    size = rng.random()
    if size < 0.15:
        return f"{_sentence(rng)} Say why.", None
    sentences = rng.randint(3, 10) if size < 0.65 else rng.randint(15, 25)
    question = f"{_text(rng, sentences)} Tell the story again in one line."
    return question, PREAMBLE if rng.random() < 0.5 else None


def make_specs(count: int, seed: int = 0) -> list[Spec]:
    """`count` requests, the same for the same seed."""
    rng = random.Random(seed)
    specs = []
    for i in range(count):
        question, preamble = _prompt(rng)
        chat, stream = rng.random() < 0.5, rng.random() < 0.5
        n = rng.choice((2, 3)) if rng.random() < 0.15 else 1
        body: dict[str, Any] = {"model": MODEL, "max_tokens": rng.randint(6, 20), "n": n}
        body["temperature"] = 0.0
        if chat:
            messages = [{"role": "system", "content": preamble}] if preamble else []
            body["messages"] = [*messages, {"role": "user", "content": question}]
            body["logprobs"], body["top_logprobs"] = True, TOP
        else:
            body["prompt"] = f"{preamble}\n\n{question}" if preamble else question
            body["logprobs"] = TOP
        if stream:
            body["stream"] = True
        specs.append(Spec(i, chat, stream, n, body))
    return specs
