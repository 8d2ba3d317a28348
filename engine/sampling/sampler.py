"""The batched sampler: one token per row of logits in a fixed number of tensor ops.

Order of operations (the same as the per-request reference sampler the tests keep):

1. penalties from the row's token counts: repetition (HF semantics, prompt + output tokens),
   then frequency and presence (output tokens only, as in the OpenAI API);
2. logprobs, for the rows that ask: log-softmax of the penalized logits, before the knobs
   that only steer the draw;
3. greedy rows: argmax (a step whose rows are all greedy stops here);
4. random rows: divide by temperature, keep the top-k, then the top-p nucleus, drop tokens
   below min_p times the best, and draw by inverse CDF with one uniform number per row.

The uniform number of a row's n-th draw is a hash of (seed, n) (splitmix64), computed on the
device for the whole batch: the same seed gives the same tokens whatever else is in the batch,
after a preemption, and on another node that continues the request.

On the CPU, steps 3-4 run in one C pass per row (``engine.cpu_kernels.sample``: a partial
selection instead of torch's ``topk``, the same arithmetic and the same uniform numbers, so
the same tokens); the tensor ops below stay the path on other devices and the fallback.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from engine import cpu_kernels
from engine.outputs import TokenLogprob
from engine.sampling.grammar import apply_grammar_mask
from engine.sampling.logit_bias import apply_logit_bias
from engine.sampling.rows import Penalties, StepSampling

_CANDIDATES = 4096  # tokens kept by the partial sort that top-k / top-p try first (CPU)


def _signed(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)


class BatchSample(NamedTuple):
    """token_ids: [n] int64 on the device; logprobs of the rows that asked (None: none)."""

    token_ids: torch.Tensor
    logprobs: LogprobTensors | None


def uniform_draws(seed: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """[rows] float64 in [0, 1): the n-th draw of each seed (splitmix64 of seed and n)."""
    z = seed * _GOLDEN + n + 1  # int64 arithmetic wraps like uint64
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    z = z ^ _shift_right(z, 31)
    return _shift_right(z, 11).double() * 2.0**-53


def _shift_right(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical (unsigned) shift of int64 values."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def sample(logits: torch.Tensor, step: StepSampling, kernel: bool = True) -> BatchSample:
    """One token per row. logits: [n, vocab] (not modified), row i has step's i-th settings.
    kernel: draw with the C kernel where it applies (fp32 on the CPU, kernels built)."""
    if logits.dim() != 2 or logits.shape[0] != step.rows.shape[0]:
        raise ValueError(f"logits must be [{step.rows.shape[0]}, vocab], got {tuple(logits.shape)}")
    logits = apply_logit_bias(logits.float(), step.logit_bias)
    logits = apply_grammar_mask(logits, step.grammar)  # constrained rows: -inf off-grammar
    if step.penalties is not None:
        logits = apply_penalties(logits, step.penalties)  # [n, vocab], a new tensor
    # the logits are final here: any further masking belongs above this line
    if kernel and logits.device.type == "cpu" and cpu_kernels.available():
        tokens = _draw_kernel(logits, step)
    else:
        tokens = logits.argmax(dim=-1)  # [n]
        if step.any_random and logits.shape[0]:
            drawn = _draw(logits, step)
            tokens = torch.where(step.greedy, tokens, drawn)
    return BatchSample(tokens, _logprobs(logits, tokens, step))


def _draw_kernel(logits: torch.Tensor, step: StepSampling) -> torch.Tensor:
    """The argmax and draws of steps 3-4 in C (engine.cpu_kernels.sample). Returns [n]."""
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    return cpu_kernels.sample(
        logits, step.greedy, step.temperature, step.top_k, step.top_p, step.min_p,
        step.seed, step.draws,
    )  # fmt: skip


def apply_penalties(logits: torch.Tensor, p: Penalties) -> torch.Tensor:
    """Repetition, then frequency and presence penalties; neutral rows stay as they are."""
    counts = p.output_counts  # [n, vocab] int32
    if p.prompt_seen is not None:
        seen = p.prompt_seen | (counts > 0)  # [n, vocab]
        rep = p.repetition.unsqueeze(1)  # [n, 1]
        scaled = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(seen, scaled, logits)
    penalty = p.frequency.unsqueeze(1) * counts + p.presence.unsqueeze(1) * (counts > 0)
    return logits - penalty


def _draw(logits: torch.Tensor, step: StepSampling) -> torch.Tensor:
    """Temperature, top-k / top-p, min-p, then an inverse-CDF draw. Returns [n] int64."""
    x = logits / step.temperature.unsqueeze(1)  # [n, vocab]
    if step.any_top_k_top_p:
        x = top_k_top_p(x, step.top_k, step.top_p, step.max_top_k)
    weights = x.sub_(x.max(dim=-1, keepdim=True).values).exp_()  # best token: 1
    if step.any_min_p:
        weights.masked_fill_(weights < step.min_p.unsqueeze(1), 0.0)
    cdf = weights.cumsum_(dim=-1)  # [n, vocab], in place: weights are not needed after
    u = uniform_draws(step.seed, step.draws)  # [n] float64
    total = cdf[:, -1]  # [n]
    target = (u * total.double()).float()
    # u * total may round up to total: keep it below, so that some token's cdf exceeds it
    target = torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target.unsqueeze(1), right=True).squeeze(1)  # [n]


def top_k_top_p(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor, max_k: int) -> torch.Tensor:
    """-inf on all but each row's top-k, then on all but the top-p nucleus of what is left.

    logits: [n, vocab]; k: [n] (vocab = off); p: [n]; max_k: the largest k (a host number).
    On the CPU the best _CANDIDATES tokens are sorted first, which is exact for a row whose
    top-k or nucleus fits in them; only the other rows get a full sort. Elsewhere the full sort.
    """
    vocab = logits.shape[1]
    p = p.unsqueeze(1)  # [n, 1]
    width = min(_CANDIDATES, vocab, max_k) if logits.device.type == "cpu" else vocab
    values, order = logits.topk(width, dim=-1)  # [n, width], descending
    values = _mask_beyond_k(values, k)
    out = torch.full_like(logits, float("-inf"))  # [n, vocab]
    if width == vocab:
        return out.scatter_(1, order, _nucleus(values, values.logsumexp(dim=-1), p))
    lse = values.logsumexp(dim=-1)  # [n]
    full_lse = logits.logsumexp(dim=-1)  # [n]
    exact = (k <= width) | ((k == vocab) & ((lse - full_lse).exp() >= p[:, 0]))  # [n]
    lse = torch.where(k <= width, lse, full_lse)
    out.scatter_(1, order, _nucleus(values, lse, p))
    rows = (~exact).nonzero().squeeze(1)
    if rows.numel():
        values, order = logits[rows].sort(dim=-1, descending=True)  # [r, vocab]
        values = _mask_beyond_k(values, k[rows])
        out[rows] = torch.empty_like(values).scatter_(
            1, order, _nucleus(values, values.logsumexp(dim=-1), p[rows])
        )
    return out


def _nucleus(values: torch.Tensor, lse: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """values: [n, w] sorted descending, lse: [n] their row normalizer, p: [n, 1].

    -inf on the tokens outside each row's top-p nucleus; the best token always stays.
    """
    probs = (values - lse.unsqueeze(1)).exp()  # [n, w]
    mass_before = probs.cumsum(dim=-1) - probs  # probability of strictly better tokens
    position = torch.arange(values.shape[1], device=values.device)
    drop = (mass_before >= p) & (position > 0) & (p < 1.0)
    return values.masked_fill(drop, float("-inf"))


def _mask_beyond_k(values: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """values: [n, w] sorted descending; -inf from position k[i] on."""
    position = torch.arange(values.shape[1], device=values.device)
    return values.masked_fill(position >= k.unsqueeze(1), float("-inf"))


class LogprobTensors(NamedTuple):
    """Logprobs of the rows that asked, still on the device: [a] and [a, n_top]."""

    token_ids: torch.Tensor
    chosen: torch.Tensor
    top_values: torch.Tensor
    top_ids: torch.Tensor


def _logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, step: StepSampling
) -> LogprobTensors | None:
    """Sampled-token logprob plus the top-n, for the rows that ask."""
    if not step.logprob_positions:
        return None
    at = torch.tensor(step.logprob_positions, device=logits.device)
    lp = torch.log_softmax(logits[at], dim=-1)  # [a, vocab]
    picked = tokens[at]  # [a]
    chosen = lp.gather(1, picked.unsqueeze(1)).squeeze(1)  # [a]
    values, ids = lp.topk(max(step.logprobs), dim=-1)  # [a, n_top]
    return LogprobTensors(picked, chosen, values, ids)


def token_logprobs(lp: LogprobTensors, top_n: tuple[int, ...]) -> list[TokenLogprob]:
    """The host objects, one per row that asked (top_n: how many alternatives each)."""
    ids, values = lp.token_ids.tolist(), lp.chosen.tolist()
    tv, ti = lp.top_values.tolist(), lp.top_ids.tolist()
    return [
        TokenLogprob(ids[j], values[j], tuple(zip(ti[j][:n], tv[j][:n], strict=True)))
        for j, n in enumerate(top_n)
    ]
