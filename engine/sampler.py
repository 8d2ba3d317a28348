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
from engine.request import Request

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

    def sample(self, logits: torch.Tensor, requests: Sequence[Request]) -> SampleResult:
        """Pick one token for each request. logits: [n, vocab], row i belongs to requests[i]."""
        if logits.dim() != 2 or logits.shape[0] != len(requests):
            raise ValueError(
                f"logits must be [{len(requests)}, vocab] for {len(requests)} requests, "
                f"got {tuple(logits.shape)}"
            )
        logits = _apply_penalties(logits.float(), requests)  # [n, vocab]
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
        """Temperature, top-k, top-p, min-p, then a draw. logits: [m, vocab] -> tokens [m]."""
        device = logits.device
        temps = torch.tensor([r.params.temperature for r in requests], device=device)
        logits = logits / temps.unsqueeze(1)  # [m, vocab]
        top_k = [r.params.top_k for r in requests]
        top_p = [r.params.top_p for r in requests]
        if any(k > 0 for k in top_k) or any(p < 1.0 for p in top_p):
            logits = _top_k_top_p(logits, top_k, top_p)
        probs = torch.softmax(logits, dim=-1)  # [m, vocab]
        min_p = [r.params.min_p for r in requests]
        if any(p > 0.0 for p in min_p):
            probs = _min_p(probs, min_p)
        q = self._exponential(probs.shape, requests, device)  # [m, vocab]
        return (probs / q).argmax(dim=-1)

    def _exponential(
        self, shape: torch.Size, requests: list[Request], device: torch.device
    ) -> torch.Tensor:
        """Exp(1) noise, [m, vocab]: seeded rows from their own generator, the rest shared."""
        q = torch.empty(shape, device=device)
        shared = [i for i, r in enumerate(requests) if r.params.seed is None]
        if shared:
            noise = torch.empty((len(shared), shape[1]), device=device)
            q[shared] = noise.exponential_(generator=self._shared_generator(device))
        for i, request in enumerate(requests):
            seed = request.params.seed
            if seed is not None:
                step = step_seed(seed, len(request.output_token_ids))
                q[i].exponential_(
                    generator=self._request_generator(request.request_id, step, device)
                )
        return q.clamp_min_(torch.finfo(q.dtype).tiny)  # no 0/0

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
    """Repetition, frequency and presence penalties on the rows that ask for them."""
    rows = [i for i, r in enumerate(requests) if r.params.has_penalties]
    if not rows:
        return logits
    picked = [requests[i] for i in rows]
    vocab = logits.shape[1]
    sub = logits[rows]  # [m, vocab], a copy: the caller's logits stay untouched
    rep = [r.params.repetition_penalty for r in picked]
    if any(p != 1.0 for p in rep):
        seen = _token_counts([r.all_token_ids for r in picked], vocab, sub.device) > 0
        penalty = torch.tensor(rep, device=sub.device).unsqueeze(1).expand_as(sub)  # [m, vocab]
        scaled = torch.where(sub > 0, sub / penalty, sub * penalty)
        sub = torch.where(seen, scaled, sub)
    freq = [r.params.frequency_penalty for r in picked]
    pres = [r.params.presence_penalty for r in picked]
    if any(f != 0.0 for f in freq) or any(p != 0.0 for p in pres):
        counts = _token_counts([r.output_token_ids for r in picked], vocab, sub.device)
        sub = sub - torch.tensor(freq, device=sub.device).unsqueeze(1) * counts
        sub = sub - torch.tensor(pres, device=sub.device).unsqueeze(1) * (counts > 0).float()
    out = logits.clone()
    out[rows] = sub
    return out


def _token_counts(token_lists: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """How often each token id occurs per list: [len(token_lists), vocab] float32."""
    width = max((len(t) for t in token_lists), default=0)
    counts = torch.zeros((len(token_lists), vocab + 1), device=device)  # last column: padding
    if width == 0:
        return counts[:, :vocab]
    padded = [t + [vocab] * (width - len(t)) for t in token_lists]
    ids = torch.tensor(padded, device=device).clamp_(0, vocab)  # [m, width]
    counts.scatter_add_(1, ids, torch.ones(ids.shape, device=device))
    return counts[:, :vocab]


def _top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Mask all but each row's top-k, then all but the top-p nucleus of what remains."""
    m, vocab = logits.shape
    device = logits.device
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)  # [m, vocab]
    k = torch.tensor([kk if 0 < kk < vocab else vocab for kk in top_k], device=device)
    position = torch.arange(vocab, device=device).expand(m, vocab)  # [m, vocab]
    sorted_logits = sorted_logits.masked_fill(position >= k.unsqueeze(1), float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)  # [m, vocab]
    mass_before = probs.cumsum(dim=-1) - probs  # probability of strictly better tokens
    p = torch.tensor(top_p, device=device).unsqueeze(1)
    drop = (mass_before >= p) & (position > 0)  # the best token always stays
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _min_p(probs: torch.Tensor, min_p: list[float]) -> torch.Tensor:
    """Zero the tokens whose probability is below min_p x the row's largest. probs: [m, vocab]."""
    threshold = torch.tensor(min_p, device=probs.device).unsqueeze(1)
    threshold = threshold * probs.max(dim=-1, keepdim=True).values  # [m, 1]
    return probs.masked_fill(probs < threshold, 0.0)


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
