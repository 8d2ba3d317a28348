"""What plugs into the step (engine.step.stepper): a hook sees the step at fixed points and
keeps per-request state it frees in `release`. Speculation (engine.speculative.step_hook)
proposes before the schedule and verifies after the sampler; grammars
(engine.step.grammar_hook) mask the logits and follow the sampled tokens.

Every method here does nothing: a hook overrides the points it needs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from engine.sampling.rows import StepSampling
    from engine.scheduler.plan import SchedulerOutput, StepUpdate
    from engine.scheduler.request import Request
    from engine.step.counters import EngineCounters
    from engine.step.result import LaunchedStep


class StepHook:
    """A part of the step that is not the model or the sampler (no-op defaults)."""

    def needs_tokens(self) -> bool:
        """The next step must see every token so far: no step may be in flight."""
        return False

    def before_schedule(self, running: Sequence[Request]) -> None:
        """Before the scheduler plans the step (`running`: the batch as it stands)."""

    def after_schedule(self, out: SchedulerOutput) -> None:
        """The step's plan, before its inputs are built."""

    def before_forward(self, requests: Sequence[Request], device: torch.device) -> None:
        """The sampled rows, in step order, as the forward starts (work to overlap with it)."""

    def sampling(self, step: StepSampling) -> StepSampling:
        """The settings the sampler uses for the step's rows (after the forward)."""
        return step

    def verify(
        self,
        out: SchedulerOutput,
        requests: Sequence[Request],
        logits: torch.Tensor,
        step: StepSampling,
        tokens: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, list[int]]]:
        """The sampled tokens as the step emits them, and the tokens a row emits after its
        first, by request id (speculative chunks)."""
        return tokens, {}

    def tokens_sampled(self, launched: LaunchedStep, token_ids: Sequence[int]) -> None:
        """A launched step's tokens reached the host, before the scheduler applies them."""

    def applied(self, launched: LaunchedStep, update: StepUpdate) -> int:
        """The scheduler applied the step; returns the tokens it appended beyond one per row."""
        return 0

    def release(self, request_id: str) -> None:
        """The request left the batch (finished, aborted or handed on): drop its state."""

    def count(self, counters: EngineCounters) -> None:
        """Copy the hook's totals into the engine's counters (after every step)."""
