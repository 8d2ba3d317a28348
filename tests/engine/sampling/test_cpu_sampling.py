"""The C sampling kernel (engine.cpu_kernels.sample) draws the same tokens as the batched
sampler's tensor path, keeps the (seed, n) contract, and stands in for it on the CPU.

Why token equality is the oracle: both paths compute the same quantities in the same order
where the order decides a token (the CDF is accumulated in double and compared as float, as
torch's CPU cumsum does; the uniform number is the same splitmix64 of (seed, n)). What may
differ is the last bit of an exp and the summation order of a normalizer, which moves a CDF
or nucleus boundary by about 1e-7 of the total: a token can only differ when a draw falls
that close to a boundary. The inputs below are fixed (seeded), so these tests are
deterministic, and they cover several thousand draws without one such case.
"""

from __future__ import annotations

import random

import pytest
import torch

from engine import cpu_kernels
from engine.sampling import sampler as batch_sampler
from engine.sampling.rows import SamplingRows
from models.sampling_params import SamplingParams

pytestmark = pytest.mark.skipif(
    not cpu_kernels.available(), reason="the CPU kernels need a C compiler (cc or $CC)"
)
CPU = torch.device("cpu")


def _mixed_rows(rows: int, vocab: int, seed: int) -> tuple[SamplingRows, torch.Tensor]:
    """A table of `rows` requests with mixed settings, penalties and biases included."""
    rng = random.Random(seed)
    table = SamplingRows(rows, vocab, CPU, seed=seed)
    for row in range(rows):
        params = SamplingParams(
            temperature=rng.choice([0.0, 0.3, 0.8, 1.0, 1.7]),
            top_k=rng.choice([0, 0, 1, 2, 5, 50, vocab - 1, vocab + 10, 4097]),
            top_p=rng.choice([1.0, 1.0, 0.95, 0.9, 0.5, 0.05]),
            min_p=rng.choice([0.0, 0.0, 0.05, 0.3]),
            seed=rng.choice([None, row * 7 + seed]),
            presence_penalty=rng.choice([0.0, 0.0, 0.5]),
            repetition_penalty=rng.choice([1.0, 1.0, 1.3]),
            logit_bias=rng.choice([(), ((rng.randrange(vocab), 5.0),)]),
        )
        output = [rng.randrange(vocab) for _ in range(rng.randrange(6))]
        table.set(row, params, [rng.randrange(vocab) for _ in range(3)], output)
    return table, torch.arange(rows, dtype=torch.int64)


def _both(logits: torch.Tensor, table: SamplingRows, rows: torch.Tensor) -> tuple[list, list]:
    step = table.gather(rows.tolist(), rows)
    kernel = batch_sampler.sample(logits, step, kernel=True).token_ids.tolist()
    tensors = batch_sampler.sample(logits, step, kernel=False).token_ids.tolist()
    return kernel, tensors


@pytest.mark.parametrize("vocab", [64, 512, 5000])
@pytest.mark.parametrize("scale", [0.3, 3.0, 12.0])
def test_kernel_draws_the_tokens_of_the_tensor_path(vocab: int, scale: float) -> None:
    rows = 128
    table, rows_t = _mixed_rows(rows, vocab, seed=vocab + int(scale * 10))
    gen = torch.Generator().manual_seed(vocab)
    for step in range(3):  # three steps: the draw counters move on
        logits = torch.randn((rows, vocab), generator=gen) * scale
        kernel, tensors = _both(logits, table, rows_t)
        assert kernel == tensors, f"step {step}"
        table.record(rows_t, torch.tensor(kernel))


def test_masked_tokens_are_never_drawn_and_rows_agree() -> None:
    """-inf logits (a token mask) stay out of every draw, on both paths alike."""
    vocab, rows = 300, 96
    table, rows_t = _mixed_rows(rows, vocab, seed=5)
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn((rows, vocab), generator=gen) * 4.0
    allowed = torch.rand((rows, vocab), generator=gen) < 0.1
    allowed[:, 7] = True  # every row allows at least one token
    allowed[0] = False
    allowed[0, 123] = True  # a row with a single allowed token
    logits = logits.masked_fill(~allowed, float("-inf"))
    kernel, tensors = _both(logits, table, rows_t)
    assert kernel == tensors
    assert all(allowed[i, t] for i, t in enumerate(kernel))
    assert kernel[0] == 123


def test_seeded_draw_depends_only_on_seed_and_counter() -> None:
    """The same request alone, or among others at another row, draws the same tokens."""
    vocab = 200
    params = SamplingParams(temperature=1.2, top_k=40, top_p=0.9, seed=1234)
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn((1, vocab), generator=gen) * 2.0
    alone = SamplingRows(1, vocab, CPU)
    alone.set(0, params, [1], [])
    crowd = SamplingRows(16, vocab, CPU, seed=3)
    for row in range(16):
        crowd.set(row, SamplingParams(temperature=0.7, seed=row) if row != 11 else params, [1], [])
    crowd_logits = torch.randn((16, vocab), generator=gen)
    crowd_logits[11] = logits[0]
    one, many = [], []
    for _ in range(20):
        step = alone.gather([0], torch.tensor([0]))
        token = batch_sampler.sample(logits, step).token_ids
        alone.record(step.rows, token)
        one.append(int(token))
        rows = torch.arange(16)
        step = crowd.gather(rows.tolist(), rows)
        tokens = batch_sampler.sample(crowd_logits, step).token_ids
        crowd.record(rows, tokens)
        many.append(int(tokens[11]))
    assert one == many
    assert len(set(one)) > 1  # it does draw: different counters, different tokens


def test_greedy_is_the_first_largest_logit() -> None:
    logits = torch.tensor([[0.0, 3.0, 3.0, -1.0], [float("-inf"), -2.0, -5.0, -2.0]])
    out = cpu_kernels.sample(
        logits, torch.ones(2, dtype=torch.bool), torch.ones(2), torch.full((2,), 4),
        torch.ones(2), torch.zeros(2), torch.zeros(2, dtype=torch.int64),
        torch.zeros(2, dtype=torch.int64),
    )  # fmt: skip
    assert out.tolist() == [1, 1] == logits.argmax(dim=-1).tolist()
    # rows long enough for the vector lanes: ties across lanes, masked rows, a tail
    gen = torch.Generator().manual_seed(2)
    rows = torch.randn((6, 101), generator=gen)
    rows[0, [37, 70, 100]] = 9.0  # the first of three ties wins
    rows[1, :] = float("-inf")  # all masked: 0, as torch
    rows[2, :-1] = float("-inf")  # only the tail is left
    rows[3, [8, 24]] = 5.0  # ties in different lanes of the same pass
    n = rows.shape[0]
    out = cpu_kernels.sample(
        rows, torch.ones(n, dtype=torch.bool), torch.ones(n), torch.full((n,), 101),
        torch.ones(n), torch.zeros(n), torch.zeros(n, dtype=torch.int64),
        torch.zeros(n, dtype=torch.int64),
    )  # fmt: skip
    assert out.tolist() == rows.argmax(dim=-1).tolist()
    assert out.tolist()[:4] == [37, 0, 100, 8]


def test_bad_shapes_are_refused() -> None:
    ones = torch.ones(3)
    with pytest.raises(ValueError, match="settings"):
        cpu_kernels.sample(torch.zeros(2, 8), ones > 0, ones, ones, ones, ones, ones, ones)
    with pytest.raises(ValueError, match="fp32"):
        cpu_kernels.sample(torch.zeros(3, 8, dtype=torch.float64), *([ones] * 7))
