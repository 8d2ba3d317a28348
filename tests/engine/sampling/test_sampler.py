"""Sampler: greedy, filters, penalties, seeds, distribution and logprobs."""

from __future__ import annotations

import math

import pytest
import torch
from reference_sampler import Sampler, _top_k_top_p

from engine.scheduler.request import Request
from models.sampling_params import SamplingParams

VOCAB = 64


def _req(
    rid: str = "r",
    prompt: list[int] | None = None,
    output: list[int] | None = None,
    **params: object,
) -> Request:
    request = Request(rid, prompt or [0], SamplingParams(**params))  # type: ignore[arg-type]
    request.output_token_ids = list(output or [])
    return request


def _logits(n: int, seed: int = 0, vocab: int = VOCAB) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn((n, vocab), generator=gen) * 3.0


def test_greedy_batch_is_argmax() -> None:
    logits = _logits(5)
    result = Sampler().sample(logits, [_req(str(i), temperature=0.0) for i in range(5)])
    assert result.token_ids == logits.argmax(dim=-1).tolist()
    assert result.logprobs == [None] * 5


def test_sampler_does_not_modify_callers_logits() -> None:
    logits = _logits(2)
    before = logits.clone()
    requests = [
        _req("a", output=[1, 2], temperature=0.7, top_k=5, frequency_penalty=1.0),
        _req("b", prompt=[3], repetition_penalty=1.5, temperature=0.0),
    ]
    Sampler(seed=0).sample(logits, requests)
    Sampler(seed=0).sample(logits, [_req("c", top_p=0.5, min_p=0.1), _req("d", seed=3)])
    assert torch.equal(logits, before)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.5, top_k=1),
        SamplingParams(temperature=1.5, top_p=1e-6),
        SamplingParams(temperature=1.5, min_p=1.0),
    ],
)
def test_tight_filters_equal_greedy(params: SamplingParams) -> None:
    logits = _logits(8, seed=1)
    requests = [Request(str(i), [0], params) for i in range(8)]
    for _ in range(3):
        assert Sampler().sample(logits, requests).token_ids == logits.argmax(dim=-1).tolist()


def test_top_k_only_draws_from_the_k_best() -> None:
    logits = torch.zeros((1, VOCAB))
    logits[0, [5, 9, 40]] = torch.tensor([3.0, 2.0, 1.0])
    sampler = Sampler(seed=3)
    seen = {
        sampler.sample(logits, [_req(temperature=5.0, top_k=2)]).token_ids[0] for _ in range(200)
    }
    assert seen == {5, 9}


def test_top_p_keeps_smallest_nucleus() -> None:
    # probabilities 0.5, 0.3, 0.2: top_p 0.7 keeps the first two (0.5 < 0.7 <= 0.8)
    probs = torch.full((1, VOCAB), 1e-12)
    probs[0, [1, 2, 3]] = torch.tensor([0.5, 0.3, 0.2])
    logits = probs.log()
    sampler = Sampler(seed=4)
    seen = {sampler.sample(logits, [_req(top_p=0.7)]).token_ids[0] for _ in range(200)}
    assert seen == {1, 2}


def _reference_top_k_top_p(logits: torch.Tensor, k: int, p: float) -> torch.Tensor:
    """Full sort, one row: the textbook definition."""
    values, order = logits.sort(descending=True)
    if k > 0:
        values[k:] = float("-inf")
    probs = values.softmax(-1)
    drop = (probs.cumsum(-1) - probs >= p) & (p < 1.0)
    drop[0] = False
    values[drop] = float("-inf")
    return torch.full_like(logits, float("-inf")).scatter(0, order, values)


@pytest.mark.parametrize(
    ("scale", "k", "p"),
    [
        (8.0, 0, 0.9),  # peaked: nucleus inside the partial sort
        (0.1, 0, 0.9),  # flat: nucleus needs the full sort
        (1.0, 50, 1.0),
        (1.0, 6000, 0.95),  # top-k wider than the partial sort
        (0.1, 9000, 0.5),
    ],
)
def test_top_k_top_p_partial_sort_is_exact(scale: float, k: int, p: float) -> None:
    vocab = 10_000
    logits = _logits(3, seed=11, vocab=vocab) * scale
    logits[1] = _logits(1, seed=12, vocab=vocab)[0] * 8.0  # a peaked row beside it
    got = _top_k_top_p(logits, [k, k, 0], [p, p, 0.9])
    for row, (kk, pp) in enumerate([(k, p), (k, p), (0, 0.9)]):
        want = _reference_top_k_top_p(logits[row], kk, pp)
        assert torch.equal(torch.isinf(got[row]), torch.isinf(want)), row
        assert torch.allclose(got[row][~torch.isinf(got[row])], want[~torch.isinf(want)])


def test_min_p_filters_relative_to_best() -> None:
    probs = torch.full((1, VOCAB), 1e-9)
    probs[0, [7, 8, 9]] = torch.tensor([0.5, 0.3, 0.1])
    logits = probs.log()
    sampler = Sampler(seed=5)
    # min_p 0.5: threshold 0.25 keeps 7 (0.5) and 8 (0.3), drops 9 (0.1) and the tail
    seen = {sampler.sample(logits, [_req(min_p=0.5)]).token_ids[0] for _ in range(300)}
    assert seen == {7, 8}


def test_repetition_penalty_hf_semantics() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0, 0.5]])
    req = _req(prompt=[0, 1], output=[1], repetition_penalty=2.0, temperature=0.0, logprobs=0)
    expected = torch.tensor([[1.0, -4.0, 1.0, -1.0, 0.5]])  # seen: 0 (/2), 1 (*2, once)
    result = Sampler().sample(logits, [req])
    assert result.token_ids == [0]  # token 0 tied with 2; argmax keeps the first
    lp = result.logprobs[0]
    assert lp is not None
    assert lp.logprob == pytest.approx(torch.log_softmax(expected, -1)[0, 0].item(), abs=1e-6)


def test_frequency_and_presence_penalties_exact() -> None:
    logits = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    # output: token 1 twice, token 2 once; prompt token 3 does not count for these penalties
    req = _req(
        prompt=[3], output=[1, 1, 2], frequency_penalty=0.5, presence_penalty=0.25, logprobs=3
    )
    expected = torch.tensor([1.0, 1.0 - 1.0 - 0.25, 1.0 - 0.5 - 0.25, 1.0])
    lp = Sampler(seed=0).sample(logits, [req]).logprobs[0]
    assert lp is not None
    want = torch.log_softmax(expected, -1)
    got = dict(lp.top)
    assert got[0] == pytest.approx(want[0].item(), abs=1e-6)
    assert got[3] == pytest.approx(want[3].item(), abs=1e-6)
    assert got[2] == pytest.approx(want[2].item(), abs=1e-6)
    assert 1 not in got  # the most penalized token is the least likely of four


def test_penalties_steer_greedy_choice() -> None:
    logits = torch.tensor([[3.0, 2.5, 0.0]])
    plain = Sampler().sample(logits, [_req(output=[0], temperature=0.0)])
    penalized = Sampler().sample(logits, [_req(output=[0], temperature=0.0, presence_penalty=1.0)])
    assert plain.token_ids == [0]
    assert penalized.token_ids == [1]


def _run_seeded(position: int, batch: int, others_seed: int) -> list[int]:
    """Five steps of a seeded request at `position` among unseeded random requests."""
    sampler = Sampler(seed=others_seed)
    target = _req("seeded", seed=1234, temperature=1.0)
    tokens = []
    for step in range(5):
        requests = [_req(f"o{i}", temperature=1.3) for i in range(batch)]
        requests.insert(position, target)
        logits = _logits(len(requests), seed=100 + step)
        logits[position] = _logits(1, seed=step)[0]  # the target's logits do not depend on layout
        token = sampler.sample(logits, requests).token_ids[position]
        target.output_token_ids.append(token)
        tokens.append(token)
    return tokens


def test_seeded_request_is_independent_of_batch() -> None:
    alone = _run_seeded(0, 0, others_seed=1)
    assert _run_seeded(0, 3, others_seed=2) == alone
    assert _run_seeded(2, 4, others_seed=3) == alone
    assert _run_seeded(5, 5, others_seed=4) == alone


def test_different_seeds_differ_and_forget_releases() -> None:
    logits = torch.zeros((1, 1000))  # uniform: two seeds agree on 5 draws with odds 1e-15
    sampler = Sampler()
    runs = []
    for seed in (1, 2):
        req = _req(f"s{seed}", seed=seed)
        runs.append([sampler.sample(logits, [req]).token_ids[0] for _ in range(1)])
        for _ in range(4):
            req.output_token_ids.append(runs[-1][-1])
            runs[-1].append(sampler.sample(logits, [req]).token_ids[0])
    assert runs[0] != runs[1]
    assert sampler.num_seeded == 2
    sampler.forget("s1")
    sampler.forget("s2")
    sampler.forget("never-seen")
    assert sampler.num_seeded == 0


def test_seeded_request_resumes_identically_on_a_fresh_sampler() -> None:
    """Decode continuing after prefill (another process) reproduces the same stream."""
    full = _run_seeded(0, 0, others_seed=1)
    req = _req("seeded", seed=1234, output=full[:2])
    for step in range(2, 5):
        token = Sampler().sample(_logits(1, seed=step), [req]).token_ids[0]
        req.output_token_ids.append(token)
    assert req.output_token_ids == full


def test_temperature_sampling_matches_softmax() -> None:
    vocab, draws, temp = 6, 6000, 0.8
    logits = torch.tensor([[1.0, 0.5, 0.0, -0.5, 2.0, -3.0]])
    sampler = Sampler(seed=7)
    requests = [_req(str(i), temperature=temp) for i in range(draws)]
    tokens = sampler.sample(logits.expand(draws, vocab), requests).token_ids
    counts = torch.bincount(torch.tensor(tokens), minlength=vocab).float()
    expected = torch.softmax(logits[0] / temp, -1) * draws
    chi2 = (((counts - expected) ** 2) / expected).sum().item()
    assert chi2 < 25.0  # 5 degrees of freedom: p ~ 1e-4
    assert counts[4] > counts[0] > counts[1]


def test_logprobs_are_log_softmax_and_top_n_sorted() -> None:
    logits = _logits(3, seed=9)
    requests = [
        _req("a", temperature=0.0, logprobs=5),
        _req("b", temperature=0.7, top_k=3, logprobs=0),
        _req("c", temperature=0.0),
    ]
    result = Sampler(seed=1).sample(logits, requests)
    ref = torch.log_softmax(logits, dim=-1)
    a, b, c = result.logprobs
    assert c is None
    assert a is not None and b is not None
    assert a.token_id == result.token_ids[0]
    assert a.logprob == pytest.approx(ref[0, a.token_id].item(), abs=1e-6)
    assert b.logprob == pytest.approx(ref[1, b.token_id].item(), abs=1e-6)  # before top-k/temp
    assert b.top == ()
    assert len(a.top) == 5
    values = [v for _, v in a.top]
    assert values == sorted(values, reverse=True)
    assert [t for t, _ in a.top] == ref[0].topk(5).indices.tolist()
    assert all(math.isclose(v, ref[0, t].item(), abs_tol=1e-6) for t, v in a.top)


def test_shape_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="logits"):
        Sampler().sample(_logits(2), [_req()])


def test_empty_batch() -> None:
    assert Sampler().sample(torch.zeros((0, VOCAB)), []).token_ids == []
