"""Verification of guessed tokens against the target model's logits.

A speculative chunk of a request scores k + 1 positions: the distribution after its last
known token and after each of its k guesses. Guess j is checked against the distribution at
position j; the first one rejected is replaced by a token drawn from that position, and when
all k are accepted a (k + 1)-th token is drawn from the last position.

- Greedy rows accept a guess equal to the argmax (the longest matching prefix) and emit the
  argmax where they stop: the output is the one plain greedy decoding gives.
- Random rows: every proposer here guesses one token per position (a point mass), so guess
  x is accepted with probability p(x) (p: the row's distribution after temperature, top-k,
  top-p and min-p, as the sampler draws from), and on rejection the token is drawn from p
  with x removed and renormalised. Each emitted token is then distributed as p exactly (the
  rejection sampling of speculative decoding for a proposal q = 1 at x).

Draws stay a function of the request's seed and the token's index: the acceptance test of
output token n uses uniform number n of a stream salted from the seed, the draw of token n
uses uniform number n of the seed's own stream, as the plain sampler does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine import cpu_kernels
from engine.sampling.rows import StepSampling
from engine.sampling.sampler import top_k_top_p, uniform_draws

_ACCEPT_SALT = 0x5BD1E995  # xor-ed into a row's seed for its acceptance tests


def verify(
    logits: torch.Tensor,
    step: StepSampling,
    positions: Sequence[int],
    drafts: Sequence[Sequence[int]],
    num_sampled: int,
    sampled: torch.Tensor | None = None,
) -> list[list[int]]:
    """The tokens each speculative chunk emits (1 to k + 1 each, before stops).

    logits: the step's scored rows: [num_sampled] rows (one per sampled request, in step
    order; a speculative chunk's is its last position), then the rows of the chunks' guesses
    (k each, in chunk order). positions[i]: the step position (sampled row) of chunk i;
    drafts[i]: its guesses. sampled: the sampler's tokens for the sampled rows, which for a
    greedy row are its argmax (no logit bias, penalty or grammar on a speculating row).
    """
    if not positions:
        return []
    device = logits.device
    owners = torch.tensor(positions, device=device)
    if sampled is not None and bool(step.greedy[owners].all()):
        return _verify_greedy(logits[num_sampled:], sampled[owners].tolist(), drafts)
    index: list[int] = []  # scored row of each position to verify, chunk after chunk
    owner: list[int] = []  # its step position (row settings)
    offset: list[int] = []  # its index among its chunk's positions
    guess: list[int] = []  # the guess it checks (-1: the position after the last guess)
    row = num_sampled
    for position, guesses in zip(positions, drafts, strict=True):
        k = len(guesses)
        index += [*range(row, row + k), position]
        owner += [position] * (k + 1)
        offset += range(k + 1)
        guess += [*guesses, -1]
        row += k
    x = logits[torch.tensor(index, device=device)].float()  # [f, vocab]
    best = x.argmax(dim=-1)  # [f]
    guess_t = torch.tensor(guess, device=device)
    owner_t = torch.tensor(owner, device=device)
    greedy = step.greedy[owner_t]
    accepted = guess_t == best
    tokens = best
    if step.any_random and not bool(greedy.all()):
        offset_t = torch.tensor(offset, device=device)
        drawn, accepted_random = _rejection(x, step, owner_t, offset_t, guess_t)
        tokens = torch.where(greedy, best, drawn)
        accepted = torch.where(greedy, accepted, accepted_random)
    accepted_l, tokens_l = accepted.tolist(), tokens.tolist()
    emitted: list[list[int]] = []
    at = 0
    for tokens_i in drafts:
        out: list[int] = []
        for j in range(len(tokens_i) + 1):
            if j < len(tokens_i) and accepted_l[at + j]:
                out.append(tokens_i[j])
                continue
            out.append(tokens_l[at + j])
            break
        emitted.append(out)
        at += len(tokens_i) + 1
    return emitted


def _verify_greedy(
    guess_rows: torch.Tensor, last: list[int], drafts: Sequence[Sequence[int]]
) -> list[list[int]]:
    """Every chunk greedy: guess j holds when it is the argmax of its row; the token after
    the last guess is the sampler's (last[i]). Only the guesses' rows are read, in place."""
    if guess_rows.device.type == "cpu" and cpu_kernels.available():
        best = cpu_kernels.argmax(guess_rows.float())
    else:
        best = guess_rows.argmax(dim=-1)
    best_l = best.tolist()
    emitted: list[list[int]] = []
    at = 0
    for guesses, after in zip(drafts, last, strict=True):
        out: list[int] = []
        for j, g in enumerate(guesses):
            out.append(best_l[at + j])
            if g != best_l[at + j]:
                break
        else:
            out.append(after)
        emitted.append(out)
        at += len(guesses)
    return emitted


def _rejection(
    x: torch.Tensor,
    step: StepSampling,
    owner: torch.Tensor,
    offset: torch.Tensor,
    guess: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random rows: (the token drawn from p without the guess, whether the guess passed)."""
    x = x / step.temperature[owner].unsqueeze(1)
    if step.any_top_k_top_p:
        x = top_k_top_p(x, step.top_k[owner], step.top_p[owner], step.max_top_k)
    weights = x.sub_(x.max(dim=-1, keepdim=True).values).exp_()  # [f, vocab], best: 1
    if step.any_min_p:
        weights.masked_fill_(weights < step.min_p[owner].unsqueeze(1), 0.0)
    has_guess = guess >= 0
    at = guess.clamp(min=0).unsqueeze(1)
    guess_weight = weights.gather(1, at).squeeze(1) * has_guess  # [f]
    p_guess = guess_weight / weights.sum(dim=-1)
    seed, n = step.seed[owner], step.draws[owner] + offset
    passed = has_guess & (uniform_draws(seed ^ _ACCEPT_SALT, n) < p_guess.double())
    weights.scatter_(1, at, (weights.gather(1, at) - guess_weight.unsqueeze(1)).clamp_(min=0.0))
    cdf = weights.cumsum_(dim=-1)
    total = cdf[:, -1]
    target = (uniform_draws(seed, n) * total.double()).float()
    target = torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))
    drawn = torch.searchsorted(cdf, target.unsqueeze(1), right=True).squeeze(1)
    return drawn.clamp_(max=x.shape[1] - 1), passed
