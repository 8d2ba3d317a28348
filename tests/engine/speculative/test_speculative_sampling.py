"""Rejection sampling keeps the target model's distribution (engine.speculative.verify).

Many seeded requests run on a tiny random model with and without prompt lookup; the token
distributions at fixed output positions are compared with a chi-square test of homogeneity.
The seeds are fixed, so the statistic is the same on every run: the test cannot flake. The
threshold is the chi-square quantile at p = 0.001 for the degrees of freedom (Wilson-Hilferty
approximation); a verifier that always accepted guesses, or that drew the residual without
removing the guess, moves far past it (checked below on a deliberately wrong sampler)."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from tiny_llama import save_tiny_llama

from engine.config import EngineConfig
from engine.engine import LLMEngine
from models.sampling_params import SamplingParams

pytestmark = pytest.mark.usefixtures("every_guess")  # guesses independent of timing

RUNS = 1200
PROMPT = [5, 6, 7, 8] * 3 + [5, 6]  # prompt lookup guesses 7, 8, 5, 6 after it
PARAMS = {"temperature": 0.8, "top_k": 40, "max_tokens": 5, "ignore_eos": True}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("spec_sampling")
    # sharp logits: the guesses are sometimes likely, so both acceptance and rejection occur
    model = save_tiny_llama(path, seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(2.5)
    model.save_pretrained(path)
    return path


def _generate(tiny_dir: Path, method: str, seeds: range) -> tuple[list[list[int]], LLMEngine]:
    engine = LLMEngine(
        EngineConfig(
            model_dir=tiny_dir,
            block_size=4,
            num_kv_blocks=6 * RUNS,
            max_num_seqs=RUNS,
            max_num_batched_tokens=8 * RUNS,
            speculative_method=method,
            num_speculative_tokens=3,
        )
    )
    for seed in seeds:
        engine.add_request(f"s{seed}", PROMPT, SamplingParams(seed=seed, **PARAMS))
    out: dict[str, list[int]] = {f"s{s}": [] for s in seeds}
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id] += o.new_token_ids
    assert engine.stats().free_blocks == engine.stats().total_blocks
    return [out[f"s{s}"] for s in seeds], engine


def chi_square(a: Counter[int], b: Counter[int]) -> tuple[float, int]:
    """Chi-square statistic of homogeneity of two samples and its degrees of freedom; tokens
    with fewer than 10 draws in both together share one bin."""
    total = a + b
    keys = [t for t, c in total.items() if c >= 10]
    rare = [t for t in total if t not in keys]
    bins = [[a[t], b[t]] for t in keys]
    if rare:
        bins.append([sum(a[t] for t in rare), sum(b[t] for t in rare)])
    na, nb = sum(a.values()), sum(b.values())
    stat = 0.0
    for ca, cb in bins:
        for count, n in ((ca, na), (cb, nb)):
            expected = (ca + cb) * n / (na + nb)
            stat += (count - expected) ** 2 / expected
    return stat, len(bins) - 1


def critical(df: int, z: float = 3.090) -> float:
    """Chi-square quantile for df degrees of freedom at the normal quantile z (3.090: 0.999)."""
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


@pytest.fixture(scope="module")
def samples(tiny_dir: Path) -> dict[str, list[list[int]]]:
    plain, _ = _generate(tiny_dir, "none", range(RUNS))
    spec, engine = _generate(tiny_dir, "ngram", range(10_000, 10_000 + RUNS))
    stats = engine.speculative_stats
    assert stats is not None
    # both branches of the verifier ran many times
    assert stats.accepted > 200 and stats.proposed - stats.accepted > 100, stats
    return {"plain": plain, "spec": spec}


@pytest.mark.parametrize("position", [1, 2, 3, 4])
def test_token_distribution_matches_plain_sampling(
    samples: dict[str, list[list[int]]], position: int
) -> None:
    a = Counter(t[position] for t in samples["plain"])
    b = Counter(t[position] for t in samples["spec"])
    stat, df = chi_square(a, b)
    assert df >= 5
    assert stat < critical(df), (stat, df, critical(df))


def test_the_check_catches_a_verifier_that_accepts_every_guess(
    samples: dict[str, list[list[int]]],
) -> None:
    """The same statistic on a wrong output: position 1 always the first guess (7)."""
    a = Counter(t[1] for t in samples["plain"])
    wrong = Counter(7 if i % 2 else t[1] for i, t in enumerate(samples["spec"]))
    stat, df = chi_square(a, wrong)
    assert stat > 10 * critical(df)


def test_seeded_draws_do_not_depend_on_the_batch(tiny_dir: Path) -> None:
    alone, _ = _generate(tiny_dir, "ngram", range(10_000, 10_004))
    batched, _ = _generate(tiny_dir, "ngram", range(10_000, 10_000 + 64))
    assert batched[:4] == alone
