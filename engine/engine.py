"""The step-level engine: scheduler (integers) + runner (tensors) + sampler.

Not thread-safe: one thread owns an engine and calls every method. The nodes feed it from
their HTTP handlers through a command queue drained between steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.block_manager import BlockManager
from engine.config import EngineConfig, Role
from engine.model_config import ModelConfig
from engine.outputs import StepOutput, TokenLogprob
from engine.request import FinishReason, Request, RequestStatus
from engine.runner import ModelRunner
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from engine.schedule import ImportPlan
from engine.scheduler import Scheduler
from engine.step_timer import StepTimer


@dataclass
class EngineCounters:
    """Monotonic totals since start, for metrics and tests."""

    steps: int = 0
    tokens_computed: int = 0  # every token run through the model (prefill chunks + decodes)
    generated_tokens: int = 0
    prefix_hit_tokens: int = 0
    preemptions: int = 0
    finished_requests: int = 0


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
        self.runner = ModelRunner(config, self.model_config)
        self.block_manager = BlockManager(
            self.runner.num_blocks, config.block_size, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(config, self.block_manager)
        self.sampler = Sampler()
        self.counters = EngineCounters()
        self.timer = StepTimer()

    # ---- requests -------------------------------------------------------------------------

    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> None:
        """Queue a request. Raises ValueError for a duplicate id or a prompt that cannot fit."""
        self.scheduler.add(self._new_request(request_id, prompt_token_ids, params))

    def import_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        output_token_ids: list[int],
        params: SamplingParams,
    ) -> ImportPlan | None:
        """Decode role: reserve blocks for a request whose prompt KV is filled from outside.

        Returns where to write it (None: no room now), then `commit_import` admits it.
        """
        request = self._new_request(request_id, prompt_token_ids, params)
        return self.scheduler.add_prefilled(request, output_token_ids)

    def commit_import(self, request_id: str) -> None:
        self.scheduler.commit_prefilled(request_id)

    def abort(self, request_id: str) -> bool:
        """Cancel a request in any state and free its blocks. False when unknown."""
        found = self.scheduler.abort(request_id)
        self.sampler.forget(request_id)
        return found

    def release(self, request_id: str) -> bool:
        """Prefill role: free the blocks pinned after the first token. False when unknown."""
        return self.scheduler.release(request_id)

    def pinned_blocks(self, request_id: str) -> list[int]:
        request = self.scheduler.get(request_id)
        if request is None or request.status is not RequestStatus.PINNED:
            raise KeyError(f"request {request_id} holds no pinned blocks")
        return list(request.block_ids)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work

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
        timer = self.timer
        timer.start()
        out = self.scheduler.schedule()
        self.counters.preemptions += len(out.preempted)
        if out.is_empty:
            return []
        timer.lap("schedule")
        inputs = self.runner.prepare(out)
        timer.lap("prepare")
        logits = self.runner.forward(inputs)  # [num_sampled, vocab]
        timer.lap("forward")
        sampled = [self.scheduler.get(c.request_id) for c in out.chunks if c.sample]
        requests = [r for r in sampled if r is not None]
        result = self.sampler.sample(logits, requests)
        timer.lap("sample")
        tokens = {r.request_id: t for r, t in zip(requests, result.token_ids, strict=True)}
        self.counters.tokens_computed += out.num_tokens
        self.counters.generated_tokens += len(requests)
        self.counters.prefix_hit_tokens = self.block_manager.num_prefix_hit_tokens
        self.scheduler.update(out, tokens)
        outputs = [
            self._output(r, t, lp)
            for r, t, lp in zip(requests, result.token_ids, result.logprobs, strict=True)
        ]
        self.counters.steps += 1
        timer.lap("output")
        timer.end_step()
        return outputs

    # ---- helpers ----------------------------------------------------------------------------

    def _new_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> Request:
        if self.scheduler.get(request_id) is not None:
            raise ValueError(f"request id {request_id!r} is already in use")
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in prompt_token_ids):
            raise ValueError(f"request {request_id}: prompt token ids must be in [0, {vocab})")
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

    def _output(self, request: Request, token: int, logprob: TokenLogprob | None) -> StepOutput:
        done = request.status in (RequestStatus.FINISHED, RequestStatus.PINNED)
        if request.status is RequestStatus.FINISHED:
            self.sampler.forget(request.request_id)
            self.counters.finished_requests += 1
        reason = request.finish_reason
        if request.status is RequestStatus.PINNED:
            reason = FinishReason.PREFILLED
        return StepOutput(
            request_id=request.request_id,
            new_token_ids=(token,),
            logprobs=(logprob,) if logprob is not None else (),
            finished=done,
            finish_reason=reason,
            num_prompt_tokens=request.num_prompt_tokens,
            num_cached_tokens=request.num_cached_tokens,
        )


__all__ = ["EngineCounters", "EngineStats", "LLMEngine", "Role"]
