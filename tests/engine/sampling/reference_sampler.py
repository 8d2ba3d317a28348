"""Turns one row of logits per request into one token, with per-request sampling settings.

Order of operations, per row:

1. penalties: repetition (HF semantics, over prompt + output tokens), then frequency and
   presence (over output tokens only, as in the OpenAI API);
2. logprobs, when asked: log-softmax of the penalized logits, BEFORE temperature, top-k,
   top-p and min-p. They describe the model's distribution as the user's penalties shape it,
   independent of the knobs that only steer the random draw (so a greedy and a sampled run
   report the same numbers for the same token);
3. greedy rows (temperature 0): argmax;
4. random rows: divide by temperature, keep the top-k, then the top-p nucleus of what is
   left, then drop tokens whose probability is below min_p times the largest, and draw with
   the exponential race (argmax of p / q, q ~ Exp(1)), which equals a categorical draw.

Randomness: a seeded request draws only from its own generator, re-seeded every step from
(seed, number of output tokens so far). The same seed gives the same tokens whatever else is
in the batch, and also after a preemption or when another node (decode after prefill)
continues the request. Unseeded requests share one generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from engine.outputs import TokenLogprob
from engine.sampling import sampler as batch_sampler
from engine.sampling.grammar import GrammarMasks, apply_grammar_mask
from engine.sampling.logit_bias import apply_logit_bias, bias_entries
from engine.scheduler.request import Request

_MASK64 = (1 << 64) - 1


class SampleResult(NamedTuple):
    """One token per request, in the order given; logprobs[i] is None unless asked for."""

    token_ids: list[int]
    logprobs: list[TokenLogprob | None]


def step_seed(seed: int, step: int) -> int:
    """A 63-bit generator seed for `step` of a request seeded with `seed` (splitmix64 mix)."""
    z = (seed * 0x9E3779B97F4A7C15 + step + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


class Sampler:
    """Samples one token per request. Keeps a generator per seeded request until `forget`."""

    def __init__(self, seed: int | None = None) -> None:
        """`seed` fixes the generator shared by unseeded requests (None: nondeterministic)."""
        self._seed = seed
        self._shared: torch.Generator | None = None
        self._seeded: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        """Drop the generator of a finished or aborted request (no-op if it has none)."""
        self._seeded.pop(request_id, None)

    @property
    def num_seeded(self) -> int:
        """Seeded requests whose generator is held (for leak checks)."""
        return len(self._seeded)

    def sample(
        self,
        logits: torch.Tensor,
        requests: Sequence[Request],
        grammar: GrammarMasks | None = None,
    ) -> SampleResult:
        """Pick one token for each request. logits: [n, vocab], row i belongs to requests[i];
        `grammar`: token masks of the constrained rows."""
        if logits.dim() != 2 or logits.shape[0] != len(requests):
            raise ValueError(
                f"logits must be [{len(requests)}, vocab] for {len(requests)} requests, "
                f"got {tuple(logits.shape)}"
            )
        bias = bias_entries([r.params for r in requests], logits.device)
        logits = apply_grammar_mask(apply_logit_bias(logits.float(), bias), grammar)
        logits = _apply_penalties(logits, requests)  # [n, vocab]
        logprobs = self._logprobs(logits, requests)
        tokens = logits.argmax(dim=-1)  # [n]
        rows = [i for i, r in enumerate(requests) if not r.params.greedy]
        if rows:
            tokens[rows] = self._sample_random(logits[rows], [requests[i] for i in rows])
        token_ids: list[int] = tokens.tolist()
        return SampleResult(token_ids, _token_logprobs(logprobs, requests, token_ids))

    def _logprobs(self, logits: torch.Tensor, requests: Sequence[Request]) -> torch.Tensor | None:
        if all(r.params.logprobs is None for r in requests):
            return None
        return torch.log_softmax(logits, dim=-1)  # [n, vocab]

    def _sample_random(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        """Temperature, top-k, top-p, min-p, then a draw. logits: [m, vocab] (a scratch copy)."""
        device = logits.device
        temps = torch.tensor([r.params.temperature for r in requests], device=device)
        logits.div_(temps.unsqueeze(1))  # [m, vocab]
        rows = [i for i, r in enumerate(requests) if r.params.top_k > 0 or r.params.top_p < 1.0]
        if rows:
            top_k = [requests[i].params.top_k for i in rows]
            top_p = [requests[i].params.top_p for i in rows]
            logits[rows] = _top_k_top_p(logits[rows], top_k, top_p)
        # unnormalized probabilities, 1 at each row's best token: the draw needs no normalizing
        weights = logits.sub_(logits.max(dim=-1, keepdim=True).values).exp_()  # [m, vocab]
        min_p = [r.params.min_p for r in requests]
        if any(p > 0.0 for p in min_p):
            threshold = torch.tensor(min_p, device=device).unsqueeze(1)  # relative to the best
            weights.masked_fill_(weights < threshold, 0.0)
        q = self._exponential(weights.shape, requests, device)  # [m, vocab]
        return weights.div_(q).argmax(dim=-1)

    def _exponential(
        self, shape: torch.Size, requests: list[Request], device: torch.device
    ) -> torch.Tensor:
        """Exp(1) noise, [m, vocab]: seeded rows from their own generator, the rest shared.

        Drawn as -log(uniform): on CPU several times faster than Tensor.exponential_.
        """
        shared = [i for i, r in enumerate(requests) if r.params.seed is None]
        if len(shared) == len(requests):
            u = torch.rand(shape, device=device, generator=self._shared_generator(device))
            return u.log_().neg_().clamp_min_(torch.finfo(u.dtype).tiny)
        u = torch.empty(shape, device=device)
        if shared:
            gen = self._shared_generator(device)
            u[shared] = torch.rand((len(shared), shape[1]), device=device, generator=gen)
        for i, request in enumerate(requests):
            seed = request.params.seed
            if seed is not None:
                step = step_seed(seed, len(request.output_token_ids))
                u[i].uniform_(generator=self._request_generator(request.request_id, step, device))
        return u.log_().neg_().clamp_min_(torch.finfo(u.dtype).tiny)  # u = 0 gives inf: fine

    def _shared_generator(self, device: torch.device) -> torch.Generator:
        if self._shared is None or self._shared.device != device:
            self._shared = torch.Generator(device=device)
            if self._seed is None:
                self._shared.seed()
            else:
                self._shared.manual_seed(self._seed)
        return self._shared

    def _request_generator(
        self, request_id: str, seed: int, device: torch.device
    ) -> torch.Generator:
        gen = self._seeded.get(request_id)
        if gen is None or gen.device != device:
            gen = torch.Generator(device=device)
            self._seeded[request_id] = gen
        gen.manual_seed(seed)
        return gen


def _apply_penalties(logits: torch.Tensor, requests: Sequence[Request]) -> torch.Tensor:
    """Repetition, frequency and presence penalties on the rows that ask for them.

    Works on the penalized token ids only (gather, change, scatter back), not the whole vocab.
    """
    rows = [i for i, r in enumerate(requests) if r.params.has_penalties]
    if not rows:
        return logits
    picked = [requests[i] for i in rows]
    m, vocab = len(rows), logits.shape[1]
    device = logits.device
    # padded ids point at a spare column `vocab`, dropped at the end
    sub = torch.cat([logits[rows], logits.new_zeros((m, 1))], dim=1)  # [m, vocab + 1]
    rep = [r.params.repetition_penalty for r in picked]
    if any(p != 1.0 for p in rep):
        ids = _padded_ids([r.all_token_ids for r in picked], vocab, device)  # [m, L]
        penalty = torch.tensor(rep, device=device).unsqueeze(1)  # [m, 1]
        seen = sub.gather(1, ids)  # [m, L]
        sub.scatter_(1, ids, torch.where(seen > 0, seen / penalty, seen * penalty))
    freq = [r.params.frequency_penalty for r in picked]
    pres = [r.params.presence_penalty for r in picked]
    if any(f != 0.0 for f in freq) or any(p != 0.0 for p in pres):
        ids = _padded_ids([r.output_token_ids for r in picked], vocab, device)  # [m, L]
        counts = torch.zeros_like(sub).scatter_add_(1, ids, torch.ones(ids.shape, device=device))
        count = counts.gather(1, ids)  # [m, L], occurrences of each listed id
        penalty = torch.tensor(freq, device=device).unsqueeze(1) * count
        penalty += torch.tensor(pres, device=device).unsqueeze(1) * (count > 0).float()
        sub.scatter_(1, ids, sub.gather(1, ids) - penalty)
    out = logits.clone()
    out[rows] = sub[:, :vocab]
    return out


def _padded_ids(token_lists: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """Token ids as [len(token_lists), longest] int64, padded (and out-of-range ids) -> vocab."""
    width = max(1, max(len(t) for t in token_lists))
    padded = [t + [vocab] * (width - len(t)) for t in token_lists]
    ids = torch.tensor(padded, dtype=torch.long, device=device)
    return ids.masked_fill_((ids < 0) | (ids > vocab), vocab)


def _top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Mask all but each row's top-k, then all but the top-p nucleus of what remains
    (engine.sampling.sampler.top_k_top_p, from per-request lists)."""
    vocab = logits.shape[1]
    ks = [kk if 0 < kk < vocab else vocab for kk in top_k]
    k = torch.tensor(ks, device=logits.device)  # [m]
    p = torch.tensor(top_p, device=logits.device)  # [m]
    return batch_sampler.top_k_top_p(logits, k, p, max(ks, default=vocab))


def _token_logprobs(
    logprobs: torch.Tensor | None, requests: Sequence[Request], token_ids: list[int]
) -> list[TokenLogprob | None]:
    """Sampled-token logprob plus top-n alternatives for the requests that ask."""
    result: list[TokenLogprob | None] = [None] * len(requests)
    if logprobs is None:
        return result
    asked = [i for i, r in enumerate(requests) if r.params.logprobs is not None]
    picked = torch.tensor([token_ids[i] for i in asked], device=logprobs.device)
    chosen: list[float] = logprobs[asked].gather(1, picked.unsqueeze(1)).squeeze(1).tolist()
    n_top = max(requests[i].params.logprobs or 0 for i in asked)
    top_vals: list[list[float]] = []
    top_ids: list[list[int]] = []
    if n_top > 0:
        values, indices = logprobs[asked].topk(n_top, dim=-1)  # [a, n_top], sorted
        top_vals, top_ids = values.tolist(), indices.tolist()
    for j, i in enumerate(asked):
        n = requests[i].params.logprobs or 0
        top = tuple(zip(top_ids[j][:n], top_vals[j][:n], strict=True)) if n else ()
        result[i] = TokenLogprob(token_ids[i], chosen[j], top)
    return result
