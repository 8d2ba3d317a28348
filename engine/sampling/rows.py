"""Per-row sampling settings of the persistent batch, kept as device tensors.

A row is set once when its request enters the batch and cleared when it leaves; a step only
gathers the rows it samples. Token counts for the penalties are kept per row (allocated at
the first request that asks for a penalty) and grow by one scatter per step. Every row has a
seed: a request's own, or one drawn from this object's generator, so its n-th draw depends
on (seed, n) only (see engine.sampling.sampler).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.sampling.grammar import GrammarMasks
from engine.sampling.logit_bias import BiasEntries, bias_entries
from models.sampling_params import SamplingParams

_SEED_MASK = (1 << 63) - 1


@dataclass(frozen=True)
class StepSampling:
    """The settings of one step's sampled rows, in step order (tensors are [n])."""

    rows: torch.Tensor  # int64 rows of the persistent batch
    greedy: torch.Tensor  # bool
    temperature: torch.Tensor  # float32, 1.0 on greedy rows
    top_k: torch.Tensor  # int64, vocab when off
    top_p: torch.Tensor  # float32
    min_p: torch.Tensor  # float32
    seed: torch.Tensor  # int64
    draws: torch.Tensor  # int64: output tokens of the row so far
    any_random: bool
    any_top_k_top_p: bool
    any_min_p: bool
    max_top_k: int  # widest top-k among the live rows (vocab when one is off)
    penalties: Penalties | None
    logprobs: tuple[int, ...]  # top-n asked by each row with logprobs (0: the token only)
    logprob_positions: tuple[int, ...]  # their positions in the step
    logit_bias: BiasEntries | None = None  # of the rows that carry one, by step position
    grammar: GrammarMasks | None = None  # token masks of the constrained rows (sampling.grammar)


@dataclass(frozen=True)
class Penalties:
    """[n] settings and [n, vocab] token statistics of a step's rows."""

    repetition: torch.Tensor  # float32
    frequency: torch.Tensor  # float32
    presence: torch.Tensor  # float32
    output_counts: torch.Tensor  # int32 [n, vocab]: output tokens seen
    prompt_seen: torch.Tensor | None  # bool [n, vocab]: prompt tokens (repetition penalty only)


class SamplingRows:
    """Sampling settings of up to `max_rows` rows, on `device`."""

    def __init__(
        self, max_rows: int, vocab: int, device: torch.device, seed: int | None = None
    ) -> None:
        self.vocab = vocab
        self.device = device
        self._rng = random.Random(seed)

        def full(value: float, dtype: torch.dtype) -> torch.Tensor:
            return torch.full((max_rows,), value, dtype=dtype, device=device)

        self.greedy = full(False, torch.bool)
        self.temperature = full(1.0, torch.float32)
        self.top_k = full(vocab, torch.int64)
        self.top_p = full(1.0, torch.float32)
        self.min_p = full(0.0, torch.float32)
        self.repetition = full(1.0, torch.float32)
        self.frequency = full(0.0, torch.float32)
        self.presence = full(0.0, torch.float32)
        self.seed = full(0, torch.int64)
        self.draws = full(0, torch.int64)
        self.output_counts: torch.Tensor | None = None  # [max_rows, vocab] int32
        self.prompt_seen: torch.Tensor | None = None  # [max_rows, vocab] bool
        self.params: list[SamplingParams | None] = [None] * max_rows
        self.version = 0  # changes whenever a row's settings do
        self._counts = {"random": 0, "top": 0, "min_p": 0, "penalty": 0, "repetition": 0}
        self._counts |= {"logprobs": 0, "bias": 0}

    def set(
        self, row: int, params: SamplingParams, prompt: Sequence[int], output: Sequence[int]
    ) -> None:
        """Fill `row` for a request with these params and tokens so far."""
        self.clear(row)
        self.version += 1
        self.params[row] = params
        self._count(params, +1)
        greedy = params.greedy
        self.greedy[row] = greedy
        self.temperature[row] = 1.0 if greedy else params.temperature
        self.top_k[row] = params.top_k if 0 < params.top_k < self.vocab else self.vocab
        self.top_p[row] = params.top_p
        self.min_p[row] = params.min_p
        self.repetition[row] = params.repetition_penalty
        self.frequency[row] = params.frequency_penalty
        self.presence[row] = params.presence_penalty
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        self.seed[row] = seed & _SEED_MASK
        self.draws[row] = len(output)
        if params.has_penalties:
            self._set_counts(row, params, prompt, output)

    def clear(self, row: int) -> None:
        """Forget `row` (no-op when it is empty)."""
        params = self.params[row]
        if params is not None:
            self.version += 1
            self._count(params, -1)
            self.params[row] = None

    def gather(self, rows: Sequence[int], rows_t: torch.Tensor) -> StepSampling:
        """The settings of `rows` (rows_t: the same as an int64 tensor on the device)."""
        c = self._counts
        params = self.params
        logprobs: tuple[int, ...] = ()
        positions: tuple[int, ...] = ()
        if c["logprobs"]:
            asked = [(i, params[r].logprobs) for i, r in enumerate(rows)]  # type: ignore[union-attr]
            pairs = [(i, n) for i, n in asked if n is not None]
            positions, logprobs = tuple(i for i, _ in pairs), tuple(n for _, n in pairs)
        return StepSampling(
            rows=rows_t,
            greedy=self.greedy[rows_t],
            temperature=self.temperature[rows_t],
            top_k=self.top_k[rows_t],
            top_p=self.top_p[rows_t],
            min_p=self.min_p[rows_t],
            seed=self.seed[rows_t],
            draws=self.draws[rows_t],
            any_random=c["random"] > 0,
            any_top_k_top_p=c["top"] > 0,
            any_min_p=c["min_p"] > 0,
            max_top_k=self._max_top_k() if c["top"] else self.vocab,
            penalties=self._penalties(rows_t) if c["penalty"] else None,
            logprobs=logprobs,
            logprob_positions=positions,
            logit_bias=bias_entries([params[r] for r in rows], self.device) if c["bias"] else None,
        )

    def refresh(self, step: StepSampling) -> StepSampling:
        """The same rows' settings one step later: new draw counters and token counts."""
        rows = step.rows
        penalties = self._penalties(rows) if step.penalties is not None else None
        fresh = copy.copy(step)  # dataclasses.replace, without its per-field work
        object.__setattr__(fresh, "draws", self.draws[rows])
        object.__setattr__(fresh, "penalties", penalties)
        return fresh

    def record(self, rows: torch.Tensor, token_ids: torch.Tensor) -> None:
        """Rows [n] drew token_ids [n]: count them (device ops, no sync)."""
        self.draws.index_add_(0, rows, torch.ones_like(rows))
        if self.output_counts is not None:
            ones = torch.ones_like(token_ids, dtype=torch.int32)
            self.output_counts.index_put_((rows, token_ids), ones, accumulate=True)

    def record_more(self, rows: torch.Tensor, counts: torch.Tensor) -> None:
        """Rows [n] drew counts [n] tokens beyond the one `record` counted (a speculative
        chunk emits several): their draw counters move on by as many."""
        self.draws.index_add_(0, rows, counts)

    # ---- internals ----------------------------------------------------------------------

    def _count(self, params: SamplingParams, sign: int) -> None:
        c = self._counts
        c["random"] += sign * (not params.greedy)
        c["top"] += sign * (params.top_k > 0 or params.top_p < 1.0)
        c["min_p"] += sign * (params.min_p > 0.0)
        c["penalty"] += sign * params.has_penalties
        c["repetition"] += sign * (params.repetition_penalty != 1.0)
        c["logprobs"] += sign * (params.logprobs is not None)
        c["bias"] += sign * bool(params.logit_bias)

    def _max_top_k(self) -> int:
        ks = [p.top_k for p in self.params if p is not None and not p.greedy]
        return self.vocab if any(k == 0 for k in ks) or not ks else min(max(ks), self.vocab)

    def _set_counts(
        self, row: int, params: SamplingParams, prompt: Sequence[int], output: Sequence[int]
    ) -> None:
        rows, vocab = self.greedy.shape[0], self.vocab
        if self.output_counts is None:
            self.output_counts = torch.zeros((rows, vocab), dtype=torch.int32, device=self.device)
        ids = torch.tensor(list(output), dtype=torch.int64, device=self.device)
        counts = self.output_counts[row]
        counts.zero_()
        counts.index_put_((ids,), torch.ones_like(ids, dtype=torch.int32), accumulate=True)
        if params.repetition_penalty != 1.0:
            if self.prompt_seen is None:
                self.prompt_seen = torch.zeros((rows, vocab), dtype=torch.bool, device=self.device)
            self.prompt_seen[row] = False
            self.prompt_seen[row, torch.tensor(list(prompt), device=self.device)] = True

    def _penalties(self, rows: torch.Tensor) -> Penalties:
        assert self.output_counts is not None  # made with the first penalized row
        seen = self.prompt_seen
        return Penalties(
            repetition=self.repetition[rows],
            frequency=self.frequency[rows],
            presence=self.presence[rows],
            output_counts=self.output_counts[rows],
            prompt_seen=seen[rows] if seen is not None and self._counts["repetition"] else None,
        )
