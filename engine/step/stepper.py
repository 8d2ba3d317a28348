"""The step: schedule, build the inputs, run the model, sample, apply, with at most one step
in flight.

With overlapped scheduling the step launched now is handed out by the next call, and the
call hands out the one launched before (planned while it ran): one host sync per step. A
hook (engine.step.hooks) that needs every token so far (a grammar's mask needs the previous
token, guesses the tokens so far) makes the step run alone. `release` is the one place a
request's state outside the scheduler is freed: its batch row and every hook's record.
With KV tiers below the device (engine.kv.offload) the step's copy orders go to the copier
after scheduling, and the forward waits only for those it depends on.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from engine.kv.block_manager import BlockManager
from engine.kv.offload import KVTiers
from engine.sampling import sampler as batch_sampler
from engine.scheduler.plan import SchedulerOutput
from engine.scheduler.request import RequestStatus
from engine.scheduler.scheduler import Scheduler
from engine.scheduler.swap import SwapRule
from engine.step.counters import EngineCounters
from engine.step.hooks import StepHook
from engine.step.result import EMPTY_STEP, DeferredLogprobs, LaunchedStep, StepResult
from engine.step.runner import ModelRunner
from engine.step.timer import StepTimer


class Stepper:
    """Runs the engine's steps over its scheduler and runner, with the hooks plugged in."""

    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunner,
        block_manager: BlockManager,
        counters: EngineCounters,
        *,
        overlap: bool,
        kernel: bool,
        hooks: Sequence[StepHook] = (),
        tiers: KVTiers | None = None,
        swap: SwapRule | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.block_manager = block_manager
        self.counters = counters
        self.overlap = overlap  # plan step N + 1 while step N runs
        self.kernel = kernel  # the sampler's C pass on the CPU
        self.hooks = tuple(hooks)
        self.timer = StepTimer()
        self.last_schedule: SchedulerOutput | None = None  # the latest step's plan
        self.in_flight: LaunchedStep | None = None
        self.tiers = tiers
        self.swap = swap  # learns the prefill rate from the steps' wall time
        self._started = 0.0  # when the current run() began

    def release(self, request_id: str) -> None:
        """Free the request's state outside the scheduler (its row, every hook's record)."""
        self.runner.release(request_id)
        for hook in self.hooks:
            hook.release(request_id)

    def settle(self) -> None:
        """After an abort: a step in flight whose requests are all gone is closed now."""
        if self.in_flight is not None and not self.scheduler.has_work:
            launched, self.in_flight = self.in_flight, None
            self._finish(launched)  # nothing left to hand out

    def run(self) -> StepResult:
        """Run one step; hands out the tokens of the step it finishes (see the module)."""
        self.timer.start()
        self._started = time.perf_counter()
        waiting = [h for h in self.hooks if h.needs_tokens()]
        if waiting and self.in_flight is not None:
            # hand out the step in flight before launching one that needs its tokens
            in_flight, self.in_flight = self.in_flight, None
            return self._finish(in_flight)
        try:
            launched = self._launch()
        except Exception:
            # the steps in flight are lost: their requests are to be aborted (the loop does)
            self.in_flight = None
            self.scheduler.forget_in_flight()
            raise
        # a hook may stop needing the tokens during the launch (a proposal that granted no
        # guess starts a stretch of overlapped steps at once)
        alone = any(h.needs_tokens() for h in waiting)
        if not self.overlap or alone or (launched is not None and launched.more):
            return self._finish(launched) if launched is not None else EMPTY_STEP
        previous, self.in_flight = self.in_flight, launched
        return self._finish(previous) if previous is not None else EMPTY_STEP

    def _launch(self) -> LaunchedStep | None:
        """Schedule, build the inputs, run the model and the sampler (asynchronous on a GPU)."""
        timer, hooks = self.timer, self.hooks
        for hook in hooks:
            hook.before_schedule(self.scheduler.running)
        out = self.last_schedule = self.scheduler.schedule()
        for hook in hooks:
            hook.after_schedule(out)
        self._count_preemptions(out)
        for request_id in out.preempted:
            self.runner.release(request_id)
        tiers = self.tiers
        if tiers is not None:
            tiers.submit()
        if out.is_empty:
            return None
        timer.lap("schedule")
        requests = out.sampled_requests
        inputs = self.runner.prepare(out, requests[len(out.decodes) :])
        timer.lap("prepare")
        for hook in hooks:
            hook.before_forward(requests, self.runner.device)
        if tiers is not None:
            tiers.wait()  # its loads, swaps, and copies out of the blocks it reuses
        logits = self.runner.forward(inputs)  # [num_sampled (+ guesses' rows), vocab]
        timer.lap("forward")
        step = inputs.sampling
        assert step is not None  # the stepper always passes its requests
        for hook in hooks:
            step = hook.sampling(step)
        n = len(requests)
        sampled = logits[:n] if logits.shape[0] > n else logits  # the rest: guesses' rows
        sample = batch_sampler.sample(sampled, step, kernel=self.kernel)
        tokens = sample.token_ids
        more: dict[str, list[int]] = {}
        for hook in hooks:
            tokens, emitted = hook.verify(out, requests, logits, step, tokens)
            more.update(emitted)
        self.runner.batch.record(step.rows, tokens)
        event = None
        if tokens.device.type == "cuda":  # one non-blocking copy; waited for in fetch
            host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            tokens = host.copy_(tokens, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        logprobs = None
        if sample.logprobs is not None:
            logprobs = DeferredLogprobs(sample.logprobs, step.logprobs, step.logprob_positions)
        launched = LaunchedStep(out, requests, tokens, event, logprobs, more or None)
        timer.lap("sample")
        return launched

    def _count_preemptions(self, out: SchedulerOutput) -> None:
        counters = self.counters
        counters.preemptions += len(out.preempted)
        counters.preemptions_swap += len(out.swapped)
        counters.preemptions_recompute += len(out.preempted) - len(out.swapped)

    def _finish(self, launched: LaunchedStep) -> StepResult:
        """Wait for a launched step's tokens (the step's one sync) and apply them."""
        token_ids, logprobs = launched.fetch()
        out, counters = launched.out, self.counters
        for hook in self.hooks:
            hook.tokens_sampled(launched, token_ids)
        update = self.scheduler.update(out, token_ids, launched.more)
        for request in update.finished:
            if request.status is RequestStatus.PINNED:
                self.runner.park_state(request, self.block_manager)
            self.release(request.request_id)
            if request.status is RequestStatus.FINISHED:
                counters.finished_requests += 1
        counters.tokens_computed += out.num_tokens
        counters.generated_tokens += len(update.advanced)
        for hook in self.hooks:
            counters.generated_tokens += hook.applied(launched, update)
            hook.count(counters)
        counters.prefix_hit_tokens = self.block_manager.num_prefix_hit_tokens
        if self.tiers is not None:
            counters.kv_tiers = self.tiers.stats()
        if self.swap is not None:
            self.swap.observe(out.num_tokens, time.perf_counter() - self._started)
        counters.steps += 1
        result = StepResult(launched.requests, token_ids, logprobs, update.more)
        if len(update.advanced) != len(token_ids):  # aborted while in flight
            result = result.only(set(map(id, update.advanced)))
        self.timer.lap("output")
        self.timer.end_step()
        return result
