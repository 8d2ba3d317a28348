"""Greedy verification reads only the guesses' rows, and agrees with the general path
(engine.speculative.verify)."""

from __future__ import annotations

import random

import pytest
import torch

from engine import cpu_kernels
from engine.sampling.rows import SamplingRows
from engine.speculative.verify import verify
from models.sampling_params import SamplingParams

VOCAB = 300


def _case(seed: int) -> tuple[torch.Tensor, list[int], list[list[int]], int, torch.Tensor]:
    """Logits of a step with `sampled` rows, some of which are speculative chunks whose
    guesses agree with the argmax for a while, then not."""
    rng = random.Random(seed)
    sampled = rng.randint(1, 6)
    positions = sorted(rng.sample(range(sampled), rng.randint(1, sampled)))
    ks = [rng.randint(1, 5) for _ in positions]
    logits = torch.randn(sampled + sum(ks), VOCAB, generator=torch.Generator().manual_seed(seed))
    best = logits.argmax(dim=-1).tolist()
    drafts, row = [], sampled
    for k in ks:
        hold = rng.randint(0, k)  # guesses 1 .. hold are the argmax, the next one is not
        guesses = [best[row + j] if j < hold else (best[row + j] + 1) % VOCAB for j in range(k)]
        drafts.append(guesses)
        row += k
    return logits, positions, drafts, sampled, logits[:sampled].argmax(dim=-1)


@pytest.mark.parametrize("kernel", [True, False], ids=["c-kernel", "torch"])
def test_greedy_fast_path_equals_the_general_one(
    kernel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kernel and not cpu_kernels.available():
        pytest.skip("the C kernels did not build here")
    if not kernel:
        monkeypatch.setattr(cpu_kernels, "available", lambda: False)
    rows = SamplingRows(8, VOCAB, torch.device("cpu"), seed=0)
    for r in range(8):
        rows.set(r, SamplingParams(temperature=0.0), [1, 2], [])
    for seed in range(200):
        logits, positions, drafts, sampled, tokens = _case(seed)
        step = rows.gather(range(sampled), torch.arange(sampled))
        general = verify(logits, step, positions, drafts, sampled)
        fast = verify(logits, step, positions, drafts, sampled, tokens)
        assert fast == general, seed
        for guesses, emitted in zip(drafts, fast, strict=True):
            assert emitted[:-1] == guesses[: len(emitted) - 1]  # a prefix, then one token
