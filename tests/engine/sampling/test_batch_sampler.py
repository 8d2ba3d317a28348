"""The batched sampler: greedy, filters, penalties, counter-based seeds, distribution, logprobs."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from test_sampler import _reference_top_k_top_p

from engine.sampling import sampler as batch_sampler
from engine.sampling.rows import SamplingRows
from engine.sampling.sampler import BatchSample, top_k_top_p, uniform_draws
from models.sampling_params import SamplingParams

VOCAB = 64
CPU = torch.device("cpu")


@pytest.fixture(autouse=True, params=["kernel", "tensors"])
def _draw_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs on the C kernel's path (where it builds) and on the tensor path."""
    if request.param == "tensors":
        monkeypatch.setattr(batch_sampler.cpu_kernels, "available", lambda: False)


def _sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    outputs: Sequence[Sequence[int]] | None = None,
    prompts: Sequence[Sequence[int]] | None = None,
    rows: Sequence[int] | None = None,
    seed: int = 0,
) -> tuple[BatchSample, SamplingRows]:
    """Rows filled from scratch (row i of the step at rows[i]), then one batched draw."""
    rows = list(rows if rows is not None else range(len(params)))
    table = SamplingRows(max(rows, default=0) + 1, logits.shape[1], CPU, seed=seed)
    for i, (row, p) in enumerate(zip(rows, params, strict=True)):
        table.set(row, p, prompts[i] if prompts else [0], outputs[i] if outputs else [])
    step = table.gather(rows, torch.tensor(rows, dtype=torch.int64))
    return batch_sampler.sample(logits, step), table


def _tokens(logits: torch.Tensor, params: Sequence[SamplingParams], **kw: object) -> list[int]:
    return _sample(logits, params, **kw)[0].token_ids.tolist()  # type: ignore[arg-type]


def _logits(n: int, seed: int = 0, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randn((n, vocab), generator=torch.Generator().manual_seed(seed)) * 3.0


def test_greedy_rows_are_argmax_and_logits_are_not_modified() -> None:
    logits = _logits(5)
    before = logits.clone()
    mixed = [SamplingParams(temperature=0.0)] * 3 + [SamplingParams(top_k=5, seed=1)] * 2
    tokens = _tokens(logits, mixed)
    assert tokens[:3] == logits.argmax(dim=-1).tolist()[:3]
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
    for seed in range(3):
        assert _tokens(logits, [params] * 8, seed=seed) == logits.argmax(dim=-1).tolist()


def _draws(logits: torch.Tensor, params: SamplingParams, n: int = 300) -> set[int]:
    """Tokens drawn by n unseeded rows over the same logits."""
    return set(_tokens(logits.expand(n, -1), [params] * n, seed=3))


def test_top_k_top_p_and_min_p_draw_only_what_they_keep() -> None:
    logits = torch.zeros((1, VOCAB))
    logits[0, [5, 9, 40]] = torch.tensor([3.0, 2.0, 1.0])
    assert _draws(logits, SamplingParams(temperature=5.0, top_k=2)) == {5, 9}
    probs = torch.full((1, VOCAB), 1e-12)
    probs[0, [1, 2, 3]] = torch.tensor([0.5, 0.3, 0.2])  # top_p 0.7 keeps 1 and 2
    assert _draws(probs.log(), SamplingParams(top_p=0.7)) == {1, 2}
    probs = torch.full((1, VOCAB), 1e-9)
    probs[0, [7, 8, 9]] = torch.tensor([0.5, 0.3, 0.1])  # min_p 0.5: threshold 0.25
    assert _draws(probs.log(), SamplingParams(min_p=0.5)) == {7, 8}


@pytest.mark.parametrize(("scale", "k", "p"), [(8.0, 0, 0.9), (0.1, 0, 0.9), (1.0, 6000, 0.95)])
def test_top_k_top_p_partial_sort_is_exact(scale: float, k: int, p: float) -> None:
    vocab = 10_000
    logits = _logits(3, seed=11, vocab=vocab) * scale
    ks = torch.tensor([k or vocab, k or vocab, vocab])
    got = top_k_top_p(logits, ks, torch.tensor([p, p, 0.9]), max_k=vocab)
    for row, (kk, pp) in enumerate([(k, p), (k, p), (0, 0.9)]):
        want = _reference_top_k_top_p(logits[row], kk, pp)
        assert torch.equal(torch.isinf(got[row]), torch.isinf(want)), row


def test_penalties_match_their_definitions() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0, 0.5], [1.0, 1.0, 1.0, 1.0, 1.0]])
    params = [
        SamplingParams(repetition_penalty=2.0, temperature=0.0, logprobs=4),
        SamplingParams(frequency_penalty=0.5, presence_penalty=0.25, logprobs=4),
    ]
    # row 0: prompt [0, 1], output [1]: 0 seen (/2), 1 seen (*2, once); row 1: output 1, 1, 2
    sample, _ = _sample(logits, params, outputs=[[1], [1, 1, 2]], prompts=[[0, 1], [3]])
    expected = torch.tensor(
        [[1.0, -4.0, 1.0, -1.0, 0.5], [1.0, 1.0 - 1.0 - 0.25, 1.0 - 0.5 - 0.25, 1.0, 1.0]]
    )
    assert sample.logprobs is not None
    lps = batch_sampler.token_logprobs(sample.logprobs, (4, 4))
    want = torch.log_softmax(expected, dim=-1)
    for row, lp in enumerate(lps):
        assert lp.logprob == pytest.approx(want[row, lp.token_id].item(), abs=1e-6)
        assert [t for t, _ in lp.top] == want[row].topk(4).indices.tolist()


def test_penalty_counts_grow_with_recorded_tokens() -> None:
    logits = torch.tensor([[3.0, 2.5, 0.0]])
    params = [SamplingParams(temperature=0.0, presence_penalty=1.0)]
    sample, table = _sample(logits, params)
    assert sample.token_ids.tolist() == [0]
    rows = torch.tensor([0])
    table.record(rows, sample.token_ids)  # token 0 is now an output: penalized
    again = batch_sampler.sample(logits, table.gather([0], rows))
    assert again.token_ids.tolist() == [1]


def _splitmix_uniform(seed: int, n: int) -> float:
    mask = (1 << 64) - 1
    z = (seed * 0x9E3779B97F4A7C15 + n + 1) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return ((z ^ (z >> 31)) >> 11) * 2.0**-53


def test_uniform_draws_are_splitmix64_of_seed_and_counter() -> None:
    seeds = [0, 1, 1234, (1 << 63) - 1, 987654321987]
    counters = [0, 5, 17, 3, 100_000]
    got = uniform_draws(torch.tensor(seeds), torch.tensor(counters)).tolist()
    assert got == [_splitmix_uniform(s, n) for s, n in zip(seeds, counters, strict=True)]


def _seeded_run(position: int, others: int, table_seed: int) -> list[int]:
    """Five draws of a seeded request at `position` of a batch of unseeded ones."""
    target = SamplingParams(temperature=1.0, seed=1234)
    tokens: list[int] = []
    for step in range(5):
        params = [SamplingParams(temperature=1.3)] * others
        params.insert(position, target)
        logits = _logits(len(params), seed=100 + step)
        logits[position] = _logits(1, seed=step)[0]
        outputs = [[]] * len(params)
        outputs[position] = list(tokens)  # its draw counter: the tokens it has
        rows = [(7 * i + 3) % 97 for i in range(len(params))]  # rows do not matter either
        tokens.append(
            _tokens(logits, params, outputs=outputs, rows=rows, seed=table_seed)[position]
        )
    return tokens


def test_seeded_request_is_independent_of_batch_and_rows() -> None:
    alone = _seeded_run(0, 0, table_seed=1)
    assert _seeded_run(0, 3, table_seed=2) == alone
    assert _seeded_run(2, 4, table_seed=3) == alone
    assert _seeded_run(5, 5, table_seed=4) == alone
    assert len(set(_seeded_run(0, 0, table_seed=1))) > 1  # draws, not a constant


def test_temperature_sampling_matches_softmax() -> None:
    vocab, draws, temp = 6, 6000, 0.8
    logits = torch.tensor([[1.0, 0.5, 0.0, -0.5, 2.0, -3.0]])
    tokens = _tokens(logits.expand(draws, vocab), [SamplingParams(temperature=temp)] * draws)
    counts = torch.bincount(torch.tensor(tokens), minlength=vocab).float()
    expected = torch.softmax(logits[0] / temp, -1) * draws
    chi2 = (((counts - expected) ** 2) / expected).sum().item()
    assert chi2 < 25.0  # 5 degrees of freedom: p ~ 1e-4
    assert counts[4] > counts[0] > counts[1]


def test_shape_mismatch_raises_and_empty_batch() -> None:
    with pytest.raises(ValueError, match="logits"):
        _sample(_logits(2), [SamplingParams()])
    assert _tokens(torch.zeros((0, VOCAB)), []) == []


def test_logit_bias_keeps_tokens_out_and_pulls_them_in_for_both_samplers() -> None:
    from reference_sampler import Sampler

    from engine.scheduler.request import Request

    logits = _logits(4, seed=5)
    best = logits.argmax(dim=-1).tolist()
    banned = SamplingParams(temperature=0.0, logit_bias=((best[0], -100.0),))
    forced = SamplingParams(temperature=1.0, seed=2, logit_bias=((7, 100.0),))
    plain = SamplingParams(temperature=0.0)
    params = [banned, forced, plain, SamplingParams(temperature=1.0, seed=3)]
    before = logits.clone()
    batched = _tokens(logits, params)
    requests = [Request(str(i), [0], p) for i, p in enumerate(params)]
    per_request = Sampler(seed=0).sample(logits, requests).token_ids
    for tokens in (batched, per_request):
        assert tokens[0] != best[0]
        assert tokens[0] == logits[0].clone().index_fill_(0, torch.tensor(best[0]), -1e9).argmax()
        assert tokens[1] == 7
        assert tokens[2] == best[2]  # rows without a bias are untouched
    assert torch.equal(logits, before)


@pytest.mark.parametrize("bad", [((1, 100.5),), ((-1, 1.0),), ((1, float("nan")),), ((1,),)])
def test_bad_logit_bias_is_refused_by_name(bad: object) -> None:
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=bad)  # type: ignore[arg-type]
