"""The step-level engine: scheduler (integers) + runner (tensors) + sampler.

Not thread-safe: one thread owns an engine and calls every method. The nodes feed it from
their HTTP handlers through a command queue drained between steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from contextlib import nullcontext

from engine.admission import check_input, check_request, release_window
from engine.config import EngineConfig, Role, checkpoint_slots
from engine.config_checks import check_hybrid
from engine.kv.offload import build_tiers
from engine.lora.manager import LoraManager, LoraStats
from engine.lora.request import LoRARequest
from engine.model.config import ModelConfig
from engine.outputs import RequestOutput, request_output
from engine.parallel import RankGroup
from engine.pooling import PoolingParams, pool_prompt
from engine.sampling.grammar import Grammars
from engine.scheduler.plan import ImportPlan, SchedulerOutput
from engine.scheduler.request import Request, RequestStatus
from engine.scheduler.scheduler import Scheduler
from engine.scheduler.swap import SwapRule
from engine.speculative import SpeculativeStats, Speculator
from engine.speculative.draft import draft_kv_cache, load_draft
from engine.speculative.guess_lookahead import GuessLookahead
from engine.speculative.rows import GuessRowLayout
from engine.speculative.step_hook import SpeculationHook
from engine.step.checkpoint_hook import CheckpointHook
from engine.step.counters import EngineCounters, EngineStats
from engine.step.grammar_hook import GrammarHook
from engine.step.hooks import StepHook
from engine.step.hybrid_states import state_counts
from engine.step.result import StepResult
from engine.step.runner import ModelRunner
from engine.step.stepper import Stepper
from engine.step.timer import StepTimer
from models.sampling_params import SamplingParams


class LLMEngine:
    """Continuous-batching engine over a paged KV cache."""

    def __init__(self, config: EngineConfig) -> None:
        self.model_config = ModelConfig.from_dir(config.model_dir)
        if self.model_config.linear is not None:
            check_hybrid(config)
            if not checkpoint_slots(config):  # a hit resumes only from a state checkpoint
                config = dataclasses.replace(config, enable_prefix_caching=False)
        self.config = config
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
        # tensor and pipeline parallelism: this process is rank 0, the others run under it
        multi_rank = config.tensor_parallel_size * config.pipeline_parallel_size > 1
        self.ranks = RankGroup(config) if multi_rank else None
        with self.ranks.starting() if self.ranks is not None else nullcontext():
            self.runner = ModelRunner(
                config,
                self.model_config,
                shared_caches=draft_kv_cache(draft),
                chunk_rows=GuessRowLayout() if speculates else None,
                shard=self.ranks.shard if self.ranks is not None else None,
                ranks=self.ranks,
                pipe=self.ranks.pipe if self.ranks is not None else None,
            )
        runner = self.runner
        self.block_manager, self.kv_tiers = build_tiers(
            config, runner.layout, runner.kv_cache, runner.num_blocks
        )
        swap = None
        if self.kv_tiers is not None:
            swap = SwapRule(runner.layout.block_bytes, self.kv_tiers.copier.copy_bytes_per_s)
        self.scheduler = Scheduler(
            config,
            self.block_manager,
            GuessLookahead() if speculates else None,
            swap,
            window=release_window(config, self.model_config),
            state_room=runner.state_swap,
            checkpoints=runner.hybrid.checkpoints if runner.hybrid is not None else None,
        )
        self.grammars = Grammars(
            config.model_dir, self.model_config.vocab_size, self.model_config.eos_token_ids
        )
        self.counters = EngineCounters()
        if self.kv_tiers is not None:  # the tiers' numbers show from the start
            self.counters.kv_tiers = self.kv_tiers.stats()
        # overlapped scheduling: plan step N + 1 while step N runs (the prefill role pins
        # every request after one token, nothing to overlap); by default only where the
        # forward runs asynchronously to the host (EngineConfig.async_scheduling)
        overlap = config.async_scheduling
        if overlap is None:
            overlap = self.runner.device.type == "cuda"
        overlap = overlap and config.role is not Role.PREFILL
        hooks: list[StepHook] = [GrammarHook(self.grammars)]
        if runner.hybrid is not None and runner.hybrid.checkpoints is not None:
            hooks.append(CheckpointHook(runner.hybrid))
        self.speculator: Speculator | None = None
        if speculates:
            self.speculator = Speculator(config, self.model_config, self.runner.num_blocks, draft)
            self.speculator.overlap = overlap and self.runner.device.type == "cuda"
            hooks.append(SpeculationHook(self.speculator, self.runner.batch))
        self.stepper = Stepper(
            self.scheduler,
            self.runner,
            self.block_manager,
            self.counters,
            overlap=overlap,
            kernel=config.cpu_kernels,
            hooks=hooks,
            tiers=self.kv_tiers,
            swap=swap,
        )

    # ---- requests -------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        grammar_tokens: Sequence[int] = (),
        lora: LoRARequest | None = None,
    ) -> None:
        """Queue a request (lower `priority` first). Raises ValueError for a duplicate id or a
        prompt that cannot fit. `grammar_tokens`: for a request resumed from prompt + tokens so
        far, those tokens (the tail of the prompt), which its grammar has already matched.
        `lora`: the adapter it runs under (registered now if new; LoraLoadError, a
        ValueError, naming the file when it cannot be loaded)."""
        request = self._new_request(request_id, prompt_token_ids, params, lora)
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
        lora: LoRARequest | None = None,
    ) -> ImportPlan | None:
        """Decode role: reserve blocks for a request whose prompt KV is filled from outside
        (computed under `lora`, the same adapter it decodes under).

        Returns where to write it (None: no room now), then `commit_import` admits it.
        """
        request = self._new_request(request_id, prompt_token_ids, params, lora)
        request.priority = priority
        self._add_grammar(request_id, params, output_token_ids)
        plan = self.scheduler.add_prefilled(request, output_token_ids, self.runner.state_blocks)
        if plan is None:
            self.stepper.release(request_id)
        return plan

    def load_imported_state(self, request_id: str) -> str | None:
        """Decode role, a hybrid model: the state record read with an import's blocks into
        the request's slot; why it is refused (not a record, another request's or shape,
        corrupt), or None (done, or no state to load). A refused import is to be aborted and
        recomputed, never decoded."""
        request = self.scheduler.get(request_id)
        if request is None or self.runner.states is None:
            return None
        return self.runner.load_state(request_id, request.block_ids)

    def commit_import(self, request_id: str) -> None:
        self.scheduler.commit_prefilled(request_id)

    def embed(
        self, request_id: str, prompt_token_ids: list[int], params: PoolingParams
    ) -> list[float]:
        """The prompt's pooled vector, from a prefill-only pass whose blocks are free again on
        return (engine.pooling). ValueError for a bad prompt, or with several ranks;
        engine.pooling.NoRoom when its blocks are not free now."""
        if self.ranks is not None:
            raise ValueError("embeddings need tensor_parallel_size 1 and pipeline_parallel_size 1")
        check_input(request_id, prompt_token_ids, self.model_config.vocab_size,
                    self.max_model_len)  # fmt: skip
        chunk = self.config.max_num_batched_tokens
        return pool_prompt(
            self.runner, self.block_manager, request_id, prompt_token_ids, params, chunk
        )

    def abort(self, request_id: str) -> bool:
        """Cancel a request in any state and free its blocks. False when unknown."""
        found = self.scheduler.abort(request_id)
        self.stepper.release(request_id)
        self.stepper.settle()
        return found

    def release(self, request_id: str) -> bool:
        """Prefill role: free the blocks pinned after the first token. False when unknown."""
        return self.scheduler.release(request_id)

    def pinned_blocks(self, request_id: str) -> list[int]:
        request = self.scheduler.get(request_id)
        if request is None or request.status is not RequestStatus.PINNED:
            raise KeyError(f"request {request_id} holds no pinned blocks")
        return list(request.block_ids)

    # ---- LoRA adapters ------------------------------------------------------------------------

    def add_lora(self, lora: LoRARequest) -> None:
        """Register an adapter, read and checked now (LoraLoadError naming the file)."""
        self._lora_manager().add(lora)

    def remove_lora(self, name: str) -> bool:
        """Forget an adapter; False when it was not registered."""
        return self._lora_manager().remove(name)

    def list_loras(self) -> list[LoRARequest]:
        return self.runner.lora.registered() if self.runner.lora is not None else []

    @property
    def lora_stats(self) -> LoraStats | None:
        """Totals of the adapters (None: LoRA is off)."""
        return self.runner.lora.stats if self.runner.lora is not None else None

    def _lora_manager(self) -> LoraManager:
        if self.runner.lora is None:
            raise ValueError("LoRA adapters need enable_lora=True")
        return self.runner.lora

    @property
    def speculative_stats(self) -> SpeculativeStats | None:
        """Totals of speculative decoding (None: off)."""
        return self.speculator.stats if self.speculator is not None else None

    @property
    def timer(self) -> StepTimer:
        """Where the step's time goes (benchmarks switch it on)."""
        return self.stepper.timer

    @property
    def last_schedule(self) -> SchedulerOutput | None:
        """The latest step's plan (benchmarks)."""
        return self.stepper.last_schedule

    @property
    def has_step_in_flight(self) -> bool:
        """An overlapped step was launched and its tokens not handed out yet."""
        return self.stepper.in_flight is not None

    def close(self) -> None:
        """Finish the KV tiers' pending copies (disk files written) and stop their thread;
        stop the tensor-parallel ranks."""
        if self.ranks is not None:
            self.ranks.close()
        if self.kv_tiers is not None:
            self.kv_tiers.close()
            self.counters.kv_tiers = self.kv_tiers.stats()

    def sync_tiers(self) -> bool:
        """With no step to run: hand the KV tiers' pending copies to their copier (a finished
        or released request's blocks are written behind without another step) and refresh
        the tiers' counters. True while copies are still under way."""
        if self.kv_tiers is None:
            return False
        self.kv_tiers.submit()
        self.counters.kv_tiers = self.kv_tiers.stats()
        return self.kv_tiers.busy

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work or self.stepper.in_flight is not None

    def stats(self) -> EngineStats:
        return EngineStats(
            running=self.scheduler.num_running,
            waiting=self.scheduler.num_waiting,
            pinned=self.scheduler.num_pinned,
            importing=self.scheduler.num_importing,
            free_blocks=self.block_manager.num_free_blocks,
            total_blocks=self.block_manager.num_total_blocks,
            **state_counts(self.runner.hybrid),
        )

    # ---- the step ---------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one batch; returns one output per request that produced a token."""
        return self.to_outputs(self.step_result())

    def step_result(self) -> StepResult:
        """Run one batch; its tokens as arrays (no object per request). With overlapped
        scheduling this hands out the step launched by the previous call
        (engine.step.stepper)."""
        return self.stepper.run()

    def to_outputs(self, result: StepResult) -> list[RequestOutput]:
        """One RequestOutput per request of a step (for the nodes' streams)."""
        logprobs = result.logprobs or [None] * len(result.requests)
        more = result.more
        return [
            request_output(r, (t, *more[r.request_id]) if r.request_id in more else (t,), lp)
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
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        lora: LoRARequest | None = None,
    ) -> Request:
        if self.scheduler.get(request_id) is not None:
            raise ValueError(f"request id {request_id!r} is already in use")
        check_request(request_id, prompt_token_ids, params, self.model_config.vocab_size,
                      self.max_model_len)  # fmt: skip
        if lora is not None:
            manager = self._lora_manager()
            manager.add(lora)
            counts = manager.stats.requests
            counts[lora.lora_name] = counts.get(lora.lora_name, 0) + 1
        return Request(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            params=params,
            eos_token_ids=self.model_config.eos_token_ids,
            max_model_len=self.max_model_len,
            lora=lora,
        )


__all__ = ["EngineCounters", "EngineStats", "LLMEngine", "Role", "StepResult"]
