"""The step-level engine: scheduler (integers) + runner (tensors) + sampler.

Not thread-safe: one thread owns an engine and calls every method. The nodes feed it from
their HTTP handlers through a command queue drained between steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.config import EngineConfig, Role
from engine.kv.block_manager import BlockManager
from engine.model.config import ModelConfig
from engine.outputs import StepOutput, TokenLogprob
from engine.sampling import sampler as batch_sampler
from engine.sampling.grammar import GrammarMasks, Grammars
from engine.sampling.reference import Sampler
from engine.scheduler.plan import ImportPlan, SchedulerOutput
from engine.scheduler.request import FinishReason, Request, RequestStatus
from engine.scheduler.scheduler import Scheduler
from engine.speculative import SpeculativeStats, Speculator
from engine.speculative.draft import draft_kv_cache, load_draft
from engine.speculative.planning import GuessLookahead
from engine.speculative.rows import GuessRowLayout
from engine.step.batch import StepInputs
from engine.step.result import EMPTY_STEP, DeferredLogprobs, LaunchedStep, StepResult
from engine.step.runner import ModelRunner
from engine.step.timer import StepTimer
from models.sampling_params import SamplingParams


@dataclass
class EngineCounters:
    """Monotonic totals since start, for metrics and tests."""

    steps: int = 0
    tokens_computed: int = 0  # every token run through the model (prefill chunks + decodes)
    generated_tokens: int = 0
    prefix_hit_tokens: int = 0
    preemptions: int = 0
    finished_requests: int = 0
    constrained_requests: int = 0  # requests admitted with a grammar (engine.sampling.grammar)
    grammar_mask_seconds: float = 0.0  # time computing token masks (worker thread)
    grammar_mask_steps: int = 0  # steps that computed masks
    # speculative decoding (engine.speculative.metrics): guesses verified, accepted, tokens
    # emitted by speculative chunks, chunks verified, and the acceptance-rate histogram
    spec_proposed: int = 0
    spec_accepted: int = 0
    spec_emitted: int = 0
    spec_chunks: int = 0
    spec_acceptance_sum: float = 0.0
    spec_acceptance_buckets: tuple[int, ...] = ()


@dataclass(frozen=True)
class EngineStats:
    running: int
    waiting: int
    pinned: int
    importing: int
    free_blocks: int
    total_blocks: int

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.total_blocks if self.total_blocks else 0.0


class LLMEngine:
    """Continuous-batching engine over a paged KV cache."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_config = ModelConfig.from_dir(config.model_dir)
        self.max_model_len = min(
            config.max_model_len or self.model_config.max_position_embeddings,
            self.model_config.max_position_embeddings,
        )
        speculates = config.speculative_method != "none" and config.role is not Role.PREFILL
        # the draft's weights first: the target's KV plan counts them and prices each block
        # with the draft's block of as many (engine.kv.sizing); a wrong vocabulary stops here
        draft = (
            load_draft(config, self.model_config)
            if speculates and config.speculative_method == "draft"
            else None
        )
        self.runner = ModelRunner(
            config,
            self.model_config,
            shared_caches=draft_kv_cache(draft),
            chunk_rows=GuessRowLayout() if speculates else None,
        )
        self.block_manager = BlockManager(
            self.runner.num_blocks, config.block_size, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            config, self.block_manager, GuessLookahead() if speculates else None
        )
        self.sampler = Sampler()
        self.grammars = Grammars(
            config.model_dir, self.model_config.vocab_size, self.model_config.eos_token_ids
        )
        self.counters = EngineCounters()
        self.last_schedule: SchedulerOutput | None = None  # the latest step's plan (benchmarks)
        self.timer = StepTimer()
        # overlapped scheduling: plan step N + 1 while step N runs (batched sampler only;
        # the prefill role pins every request after one token, nothing to overlap). A step
        # that proposes guesses needs the tokens so far: it runs alone (Speculator.overlap)
        self._overlap = (
            config.async_scheduling
            and config.sampler == "batched"
            and config.role is not Role.PREFILL
        )
        self.speculator: Speculator | None = None
        if speculates:
            self.speculator = Speculator(config, self.model_config, self.runner.num_blocks, draft)
            self.speculator.overlap = self._overlap and self.runner.device.type == "cuda"
        self._in_flight: LaunchedStep | None = None

    # ---- requests -------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        grammar_tokens: Sequence[int] = (),
    ) -> None:
        """Queue a request (lower `priority` first). Raises ValueError for a duplicate id or a
        prompt that cannot fit. `grammar_tokens`: for a request resumed from prompt + tokens so
        far, those tokens (the tail of the prompt), which its grammar has already matched."""
        request = self._new_request(request_id, prompt_token_ids, params)
        request.priority = priority
        self._add_grammar(request_id, params, grammar_tokens)
        self.scheduler.add(request)

    def import_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        output_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
    ) -> ImportPlan | None:
        """Decode role: reserve blocks for a request whose prompt KV is filled from outside.

        Returns where to write it (None: no room now), then `commit_import` admits it.
        """
        request = self._new_request(request_id, prompt_token_ids, params)
        request.priority = priority
        self._add_grammar(request_id, params, output_token_ids)
        plan = self.scheduler.add_prefilled(request, output_token_ids)
        if plan is None:
            self.grammars.forget(request_id)
        return plan

    def commit_import(self, request_id: str) -> None:
        self.scheduler.commit_prefilled(request_id)

    def abort(self, request_id: str) -> bool:
        """Cancel a request in any state and free its blocks. False when unknown."""
        found = self.scheduler.abort(request_id)
        self.sampler.forget(request_id)
        self.grammars.forget(request_id)
        if self.speculator is not None:
            self.speculator.forget(request_id)
        self.runner.batch.release(request_id)
        if self._in_flight is not None and not self.scheduler.has_work:
            launched, self._in_flight = self._in_flight, None
            self._finish(launched)  # its requests are all gone: nothing left to hand out
        return found

    def release(self, request_id: str) -> bool:
        """Prefill role: free the blocks pinned after the first token. False when unknown."""
        return self.scheduler.release(request_id)

    def pinned_blocks(self, request_id: str) -> list[int]:
        request = self.scheduler.get(request_id)
        if request is None or request.status is not RequestStatus.PINNED:
            raise KeyError(f"request {request_id} holds no pinned blocks")
        return list(request.block_ids)

    @property
    def speculative_stats(self) -> SpeculativeStats | None:
        """Totals of speculative decoding (None: off)."""
        return self.speculator.stats if self.speculator is not None else None

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work or self._in_flight is not None

    def stats(self) -> EngineStats:
        return EngineStats(
            running=self.scheduler.num_running,
            waiting=self.scheduler.num_waiting,
            pinned=self.scheduler.num_pinned,
            importing=self.scheduler.num_importing,
            free_blocks=self.block_manager.num_free_blocks,
            total_blocks=self.block_manager.num_total_blocks,
        )

    # ---- the step ---------------------------------------------------------------------------

    def step(self) -> list[StepOutput]:
        """Run one batch; returns one output per request that produced a token."""
        return self.to_outputs(self.step_result())

    def step_result(self) -> StepResult:
        """Run one batch; its tokens as arrays (no object per request).

        With overlapped scheduling the step launched now is handed out by the next call,
        and this call hands out the one launched before (planned while it ran).
        """
        self.timer.start()
        constrained = self.grammars.active
        spec = self.speculator
        proposing = spec is not None and spec.wants_tokens()
        if (constrained or proposing) and self._in_flight is not None:
            # a constrained row's mask needs its previous token, and guesses the tokens so
            # far: no overlap while any request is constrained or guesses may be proposed;
            # hand out the step in flight before launching the next
            in_flight, self._in_flight = self._in_flight, None
            return self._finish(in_flight)
        try:
            launched = self._launch()
        except Exception:
            # the steps in flight are lost: their requests are to be aborted (the loop does)
            self._in_flight = None
            self.scheduler.forget_in_flight()
            raise
        # a proposal that granted no guess may start a stretch of overlapped steps at once
        alone = constrained or (proposing and spec is not None and spec.wants_tokens())
        if not self._overlap or alone or (launched is not None and launched.more):
            return self._finish(launched) if launched is not None else EMPTY_STEP
        previous, self._in_flight = self._in_flight, launched
        return self._finish(previous) if previous is not None else EMPTY_STEP

    def _launch(self) -> LaunchedStep | None:
        """Schedule, build the inputs, run the model and the sampler (asynchronous on a GPU)."""
        timer, spec = self.timer, self.speculator
        timed = spec is not None and spec.plan(self.scheduler.running)  # it runs alone
        out = self.last_schedule = self.scheduler.schedule()
        if spec is not None:  # the cost model learns from decode steps run alone only
            plain = timed and all(c.num_draft for c in out.prefills)
            spec.cost.step_started(out.num_tokens if plain else 0)
        self.counters.preemptions += len(out.preempted)
        for request_id in out.preempted:
            self.runner.batch.release(request_id)
        if out.is_empty:
            return None
        timer.lap("schedule")
        requests = out.sampled_requests
        inputs = self.runner.prepare(out, requests[len(out.decodes) :])
        timer.lap("prepare")
        masks = self.grammars.start([r.request_id for r in requests], self.runner.device)
        logits = self.runner.forward(inputs)  # [num_sampled, vocab]; masks computed meanwhile
        timer.lap("forward")
        launched = self._sample(out, logits, inputs, requests, masks.result())
        timer.lap("sample")
        return launched

    def _finish(self, launched: LaunchedStep) -> StepResult:
        """Wait for a launched step's tokens (the step's one sync) and apply them."""
        token_ids, logprobs = launched.fetch()
        out = launched.out
        if self.grammars.active:
            self.grammars.consume([r.request_id for r in launched.requests], token_ids)
        update = self.scheduler.update(out, token_ids, launched.more)
        for request in update.finished:
            self.runner.batch.release(request.request_id)
            self.grammars.forget(request.request_id)
            if self.speculator is not None:
                self.speculator.forget(request.request_id)
            if request.status is RequestStatus.FINISHED:
                self.sampler.forget(request.request_id)
                self.counters.finished_requests += 1
        self.counters.tokens_computed += out.num_tokens
        self.counters.generated_tokens += len(update.advanced)
        if self.speculator is not None:
            self.counters.generated_tokens += self.speculator.step_done(launched.more, update.more)
            for request_id in launched.more or ():
                self.runner.batch.invalidate(request_id)
            self._count_speculation(self.speculator.stats)
        self.counters.prefix_hit_tokens = self.block_manager.num_prefix_hit_tokens
        self.counters.steps += 1
        self.counters.grammar_mask_seconds = self.grammars.mask_seconds
        self.counters.grammar_mask_steps = self.grammars.mask_steps
        result = StepResult(launched.requests, token_ids, logprobs, update.more)
        if len(update.advanced) != len(token_ids):  # aborted while in flight
            result = result.only(set(map(id, update.advanced)))
        self.timer.lap("output")
        self.timer.end_step()
        return result

    def _count_speculation(self, stats: SpeculativeStats) -> None:
        c = self.counters
        c.spec_proposed, c.spec_accepted, c.spec_emitted = (
            stats.proposed,
            stats.accepted,
            stats.emitted,
        )
        c.spec_chunks, c.spec_acceptance_sum = stats.chunks, stats.acceptance_sum
        c.spec_acceptance_buckets = tuple(stats.acceptance)

    def to_outputs(self, result: StepResult) -> list[StepOutput]:
        """One StepOutput per request of a step (for the nodes' streams)."""
        logprobs = result.logprobs or [None] * len(result.requests)
        more = result.more
        return [
            _output(r, (t, *more[r.request_id]) if r.request_id in more else (t,), lp)
            for r, t, lp in zip(result.requests, result.token_ids, logprobs, strict=True)
        ]

    # ---- helpers ----------------------------------------------------------------------------

    def _add_grammar(
        self, request_id: str, params: SamplingParams, output_token_ids: Sequence[int] = ()
    ) -> None:
        """The matcher of a constrained request, fed the tokens it has (ValueError if bad)."""
        if params.grammar is not None:
            self.grammars.add(request_id, params.grammar, output_token_ids)
            self.counters.constrained_requests += 1

    def _new_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> Request:
        if self.scheduler.get(request_id) is not None:
            raise ValueError(f"request id {request_id!r} is already in use")
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in prompt_token_ids):
            raise ValueError(f"request {request_id}: prompt token ids must be in [0, {vocab})")
        if any(t >= vocab for t, _ in params.logit_bias):
            raise ValueError(f"request {request_id}: logit_bias token ids must be in [0, {vocab})")
        if len(prompt_token_ids) >= self.max_model_len:
            raise ValueError(
                f"request {request_id}: prompt has {len(prompt_token_ids)} tokens, the context "
                f"length is {self.max_model_len} (at least one token must be generated)"
            )
        return Request(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            params=params,
            eos_token_ids=self.model_config.eos_token_ids,
            max_model_len=self.max_model_len,
        )

    def _sample(
        self,
        out: SchedulerOutput,
        logits: torch.Tensor,
        inputs: StepInputs,
        requests: list[Request],
        masks: GrammarMasks | None,
    ) -> LaunchedStep:
        """Sample the step's rows; the tokens stay on the device until `LaunchedStep.fetch`."""
        if self.config.sampler == "per_request":
            result = self.sampler.sample(logits, requests, masks)
            asked = any(lp is not None for lp in result.logprobs)
            return LaunchedStep(
                out, requests, result.token_ids, None, result.logprobs if asked else None
            )
        step = inputs.sampling
        assert step is not None  # the engine always passes its requests
        if masks is not None:
            step = dataclasses.replace(step, grammar=masks)
        n = len(requests)
        sampled = logits[:n] if logits.shape[0] > n else logits  # the rest: guesses' rows
        sample = batch_sampler.sample(sampled, step, kernel=self.config.cpu_kernels)
        tokens = sample.token_ids
        more = None
        if self.speculator is not None:
            tokens, more = self.speculator.verify(out, logits, step, tokens)
        self.runner.batch.record(step.rows, tokens)
        if more:  # a speculative row drew one token per emitted token
            extra = [len(more.get(r.request_id, ())) for r in requests]
            extra_t = torch.tensor(extra, dtype=torch.int64, device=step.rows.device)
            self.runner.batch.sampling.draws.index_add_(0, step.rows, extra_t)
        event = None
        if tokens.device.type == "cuda":  # one non-blocking copy; waited for in fetch
            host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            tokens = host.copy_(tokens, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        logprobs = None
        if sample.logprobs is not None:
            logprobs = DeferredLogprobs(sample.logprobs, step.logprobs, step.logprob_positions)
        return LaunchedStep(out, requests, tokens, event, logprobs, more or None)


def _output(request: Request, tokens: tuple[int, ...], logprob: TokenLogprob | None) -> StepOutput:
    done = request.status in (RequestStatus.FINISHED, RequestStatus.PINNED)
    reason = request.finish_reason
    if request.status is RequestStatus.PINNED:
        reason = FinishReason.PREFILLED
    return StepOutput(
        request_id=request.request_id,
        new_token_ids=tokens,
        logprobs=(logprob,) if logprob is not None else (),
        finished=done,
        finish_reason=reason,
        num_prompt_tokens=request.num_prompt_tokens,
        num_cached_tokens=request.num_cached_tokens,
    )


__all__ = ["EngineCounters", "EngineStats", "LLMEngine", "Role", "StepResult"]
