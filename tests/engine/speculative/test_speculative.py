"""Speculative decoding with prompt lookup (engine.speculative): greedy output is the plain
engine's, stops inside an accepted run are honoured, and no KV block leaks after runs with
rejections, aborts and preemption."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from engine_driver import Work, drive
from tiny_llama import TRITON_DEVICE, save_tiny_llama

from engine import speculative
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.scheduler.request import FinishReason
from engine.speculative import DraftProposer, NgramProposer
from engine.speculative.cost import StepCost
from models.sampling_params import SamplingParams

pytestmark = pytest.mark.usefixtures("every_guess")  # guesses independent of timing


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("speculative")
    save_tiny_llama(path)
    return path


def test_ngram_proposes_what_followed_the_latest_match() -> None:
    proposer = NgramProposer(k=3, ngram_min=1, ngram_max=3)
    #            the suffix [7, 8] occurred at 1 and at 5; the latest is followed by 4, 5
    assert proposer.propose([1, 7, 8, 9, 2, 7, 8, 4, 5, 7, 8]) == [4, 5, 7]
    assert proposer.propose([1, 7, 8, 9, 2, 7, 8, 4, 5, 7, 8], k=1) == [4]
    assert proposer.propose([1, 2, 3, 4]) == []  # nothing repeats
    assert proposer.propose([5, 5]) == [5]  # the match may overlap the suffix
    assert proposer.propose([3]) == []
    # the longest suffix wins: [2, 3] matches at 0 (then 9); [3] alone matched later (then 1)
    assert NgramProposer(k=1, ngram_max=2).propose([2, 3, 9, 3, 1, 2, 3]) == [9]


def _reference(tokens: list[int], k: int, low: int, high: int) -> tuple[list[int], tuple]:
    """The definition, by brute force: the longest suffix (high .. low tokens) found earlier,
    its latest earlier place, what followed it, and whether it was found once."""
    for n in range(min(high, len(tokens) - 1), low - 1, -1):
        suffix = tokens[len(tokens) - n :]
        starts = [s for s in range(len(tokens) - n) if tokens[s : s + n] == suffix]
        if starts:
            after = starts[-1] + n
            return tokens[after : after + k], (n, len(starts) == 1)
    return [], (0, False)


def test_ngram_lookup_and_its_kept_tokens_agree_with_a_brute_force_search() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        tokens = [rng.randrange(rng.choice([2, 3, 6, 40])) for _ in range(rng.randint(1, 30))]
        low = rng.randint(1, 3)
        high = rng.randint(low, 6)
        k = rng.randint(1, 5)
        proposer = NgramProposer(k, low, high)
        want = _reference(tokens, k, low, high)
        assert proposer.lookup(np.asarray(tokens, dtype=np.int64), k) == want, (tokens, low, high)
        # the same request seen step after step, its output growing token by token
        cut = rng.randint(1, len(tokens))
        for end in range(cut, len(tokens) + 1):
            got = proposer.propose_for("r", tokens[:cut], tokens[cut:end], k)
            assert got == _reference(tokens[:end], k, low, high)
        proposer.forget("r")


def _workload(requests: int = 12) -> list[tuple[str, list[int], SamplingParams]]:
    kinds: list[dict[str, Any]] = [
        {"temperature": 0.0},
        {"temperature": 0.0, "stop_token_ids": (9, 17, 33, 40, 51)},
        {"temperature": 0.0, "max_tokens": 7},
        {"temperature": 0.9, "seed": 5, "frequency_penalty": 0.5},  # decoded plainly
        {"temperature": 0.0, "logprobs": 2},  # decoded plainly
    ]
    work = []
    for i in range(requests):
        motif = [(7 * i + 11 * j) % 120 + 3 for j in range(3 + i % 4)]
        prompt = motif * (2 + i % 3) + [(5 * i) % 120 + 3]
        params = SamplingParams(**({"max_tokens": 20 + 3 * (i % 5)} | kinds[i % len(kinds)]))
        work.append((f"r{i}", prompt, params))
    return work


ABORT_AFTER = {"r5": 3, "r10": 2}  # request -> tokens seen before the client aborts it


def _run(
    tiny_dir: Path, method: str, overlap: bool = False, requests: int = 12, **options: Any
) -> tuple[dict[str, Any], LLMEngine]:
    """The workload (its first `requests`) on a fresh engine; overlap: let quiet stretches
    overlap (as on a GPU), and count the steps that left one in flight."""
    config = {
        "model_dir": tiny_dir,
        "block_size": 4,
        "num_kv_blocks": 40,  # too few for all at once: preemption
        "max_num_seqs": 8,
        "max_num_batched_tokens": 48,
        "speculative_method": method,
        "num_speculative_tokens": 4,
        "async_scheduling": overlap or None,  # on the CPU only when asked
    }
    engine = LLMEngine(EngineConfig(**(config | options)))
    if engine.speculator is not None:
        engine.speculator.overlap = overlap
    start_free = engine.stats().free_blocks
    overlapped = 0

    def each_step() -> None:
        nonlocal overlapped
        engine.scheduler.audit()
        overlapped += engine.has_step_in_flight

    result = drive(engine, _workload(requests), ABORT_AFTER, each_step=each_step)
    assert engine.stats().free_blocks == start_free  # every block given back
    return {
        "tokens": result["tokens"],
        "reasons": result["reasons"],
        "overlapped": overlapped,
    }, engine


# the C kernels; the torch path; the Triton kernels (on the GPU, else interpreted on the CPU:
# slow, so 7 of the 12 requests (a stop id still met), on a cache that still preempts)
BACKENDS: dict[str, dict[str, Any]] = {
    "cpu_kernels": {},
    "torch": {"cpu_kernels": False, "pack_cpu_weights": False},
    "triton": {
        "attention_backend": "triton",
        "device": str(TRITON_DEVICE),
        "requests": 7,
        "num_kv_blocks": 20,
    },
}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_greedy_ngram_equals_plain_decoding_with_rejections_aborts_and_preemption(
    tiny_dir: Path, backend: str
) -> None:
    if backend == "triton":
        from engine.triton_kernels import triton_available

        if not triton_available():
            pytest.skip("triton needs CUDA or TRITON_INTERPRET=1")
    plain, _ = _run(tiny_dir, "none", **BACKENDS[backend])
    spec, engine = _run(tiny_dir, "ngram", **BACKENDS[backend])
    stats = engine.speculative_stats
    assert stats is not None
    assert 0 < stats.accepted < stats.proposed  # guesses accepted and rejected
    assert engine.counters.preemptions > 0
    aborted = set(ABORT_AFTER)
    for rid, want in plain["tokens"].items():
        got = spec["tokens"][rid]
        if rid in aborted:  # aborted after a step: a prefix of the same tokens
            assert got[: len(want)] == want[: len(got)], rid
        else:
            assert got == want, rid
            assert spec["reasons"][rid] == plain["reasons"][rid], rid
    stops = {rid: r for rid, r in plain["reasons"].items() if r is FinishReason.STOP}
    assert stops, "the workload must stop on a stop id somewhere"


def test_quiet_stretches_overlap_and_guessing_resumes_after_them(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where overlapped steps pay (a GPU; forced here), proposals that grant nothing let the
    next steps overlap without guesses, and a proposal after the stretch guesses again:
    greedy output still equals plain decoding, with aborts and preemption, no block lost."""
    calls = itertools.count()

    def in_waves(self: StepCost, base: int, gains: list[list[float]], *a: Any) -> list[int]:
        return [len(g) for g in gains] if next(calls) % 8 < 3 else [0] * len(gains)

    monkeypatch.setattr(StepCost, "allocate", in_waves)
    monkeypatch.setattr(speculative, "_OVERLAP_STEPS", 2)  # short stretches: many turns
    monkeypatch.setattr(speculative, "_OVERLAP_MAX", 4)
    plain, _ = _run(tiny_dir, "none", overlap=True)
    assert plain["overlapped"] > 0  # plain decoding overlaps its steps
    spec, engine = _run(tiny_dir, "ngram", overlap=True)
    stats = engine.speculative_stats
    assert stats is not None and stats.accepted >= 5  # guesses between the stretches
    assert spec["overlapped"] > 0
    assert engine.counters.preemptions > 0
    for rid, want in plain["tokens"].items():
        got = spec["tokens"][rid]
        n = min(len(got), len(want)) if rid in ABORT_AFTER else len(want)
        assert got[:n] == want[:n] and (rid in ABORT_AFTER or got == want), rid
    alone, _ = _run(tiny_dir, "ngram")  # without overlap (the CPU): every step alone
    assert alone["overlapped"] == 0


def test_stops_inside_an_accepted_run(tiny_dir: Path) -> None:
    """A guess run that crosses max_tokens, a stop id or the context length is cut there."""
    motif = [11, 12, 13, 14, 15, 16]
    prompt = motif * 5
    cases = [
        SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop_token_ids=(14,)),
    ]
    for params in cases:
        plain, spec = (
            _generate(tiny_dir, method, [("a", prompt, params)], max_model_len=48)
            for method in ("none", "ngram")
        )
        assert (spec["tokens"], spec["reasons"]) == (plain["tokens"], plain["reasons"]), params
        assert len(plain["tokens"]["a"]) <= min(params.max_tokens, 48 - len(prompt))


def _generate(tiny_dir: Path, method: str, work: Work, **options: Any) -> dict[str, Any]:
    """Tokens and finish reasons of `work`, all added at once; every block comes back."""
    config = {"model_dir": tiny_dir, "block_size": 4, "num_kv_blocks": 64}
    engine = LLMEngine(EngineConfig(**config, speculative_method=method, **options))
    result = drive(engine, work, {}, first=len(work))
    assert engine.stats().free_blocks == engine.stats().total_blocks
    return result


@pytest.fixture(scope="module")
def other_tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A different random model of the same vocabulary: a draft whose guesses often fail."""
    path = tmp_path_factory.mktemp("speculative_draft")
    save_tiny_llama(path, seed=1, num_hidden_layers=1)
    return path


@pytest.mark.parametrize("draft", ["self", "other"])
def test_greedy_draft_model_equals_plain_decoding(
    tiny_dir: Path, other_tiny_dir: Path, draft: str
) -> None:
    plain, _ = _run(tiny_dir, "none")
    draft_dir = tiny_dir if draft == "self" else other_tiny_dir
    spec, engine = _run(tiny_dir, "draft", draft_model=draft_dir)
    stats = engine.speculative_stats
    assert stats is not None and stats.proposed > 0
    if draft == "self":  # the model guessing its own argmax: (nearly) every guess holds
        assert stats.accepted >= 0.9 * stats.proposed
    else:
        assert 0 < stats.accepted < stats.proposed
    for rid, want in plain["tokens"].items():
        got = spec["tokens"][rid]
        if rid in ABORT_AFTER:
            assert got[: len(want)] == want[: len(got)], rid
        else:
            assert got == want, rid
    assert engine.speculator is not None and engine.speculator.draft is not None
    assert (
        engine.speculator.draft.blocks.num_free_blocks
        == engine.speculator.draft.blocks.num_total_blocks
    )


def test_draft_catches_up_in_forwards_no_larger_than_the_token_budget(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request's prompt reaches the draft in pieces of at most max_num_batched_tokens, as
    it reaches the target: the activation memory the KV plan kept covers both."""
    sizes: list[int] = []
    forward = DraftProposer._forward

    def recorded(self: DraftProposer, feed: list[list[int]], *args: Any) -> Any:
        sizes.append(sum(map(len, feed)))
        return forward(self, feed, *args)

    monkeypatch.setattr(DraftProposer, "_forward", recorded)
    prompts = [[(7 * i + j) % 97 + 3 for j in range(30 + i)] for i in range(3)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    work = [(f"r{i}", prompt, params) for i, prompt in enumerate(prompts)]
    plain = _generate(tiny_dir, "none", work, max_num_batched_tokens=8)
    drafted = _generate(tiny_dir, "draft", work, max_num_batched_tokens=8, draft_model=tiny_dir)
    assert drafted["tokens"] == plain["tokens"]
    assert sum(sizes) >= sum(map(len, prompts))  # the draft saw every prompt
    assert max(sizes) <= 8


def test_draft_model_of_another_vocabulary_is_refused(
    tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    other = tmp_path_factory.mktemp("other_vocab")
    save_tiny_llama(other, vocab_size=96)
    with pytest.raises(ValueError, match="same vocabulary"):
        LLMEngine(
            EngineConfig(
                model_dir=tiny_dir, num_kv_blocks=16, speculative_method="draft", draft_model=other
            )
        )


def test_decode_role_speculates_on_imported_requests(tiny_dir: Path) -> None:
    """A request whose prompt KV comes from a prefill engine (the decode pool's path)."""
    prompt = [(7 * j) % 50 + 3 for j in range(9)] * 3
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    base = {"model_dir": tiny_dir, "block_size": 4, "num_kv_blocks": 64}
    plain = LLMEngine(EngineConfig(**base))
    plain.add_request("a", prompt, params)
    want: list[int] = []
    while plain.has_unfinished():
        for o in plain.step():
            want += o.new_token_ids
    prefill = LLMEngine(EngineConfig(**base, role="prefill"))
    prefill.add_request("a", prompt, params)
    first = prefill.step()[0].new_token_ids
    decode = LLMEngine(EngineConfig(**base, role="decode", speculative_method="ngram"))
    plan = decode.import_request("a", prompt, list(first), params)
    assert plan is not None
    source = prefill.pinned_blocks("a")
    for src, dst in zip(source[plan.num_cached_blocks :], plan.fill_block_ids, strict=False):
        decode.runner.kv_cache[dst] = prefill.runner.kv_cache[src]
    decode.commit_import("a")
    got = list(first)
    while decode.has_unfinished():
        for o in decode.step():
            got += o.new_token_ids
    assert got == want
    stats = decode.speculative_stats
    assert stats is not None and stats.proposed > 0
    assert decode.stats().free_blocks == decode.stats().total_blocks


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"speculative_method": "medusa"}, "speculative_method"),
        ({"speculative_method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"speculative_method": "ngram", "ngram_min": 3, "ngram_max": 2}, "ngram"),
        ({"speculative_method": "draft"}, "draft_model"),
        ({"speculative_method": "draft", "draft_model": "/no/such/dir"}, "no/such/dir"),
        ({"draft_model": "/tmp"}, "draft_model"),
    ],
)
def test_bad_speculative_settings_name_the_field(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(model_dir=Path("unused"), **options)
