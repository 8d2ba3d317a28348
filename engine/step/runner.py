"""ModelRunner: turns a SchedulerOutput into tensors, runs the model, returns logits.

It owns the weights and the KV cache and knows nothing of requests, sampling or scheduling.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Protocol, TypeVar

import torch

from engine.config import EngineConfig
from engine.kv.block_manager import BlockManager
from engine.kv.cache import allocate_kv_cache
from engine.kv.sizing import DeviceMemory, SharedCache, plan_kv_cache
from engine.lora.delta import LoraBatch, choose_kernel
from engine.lora.manager import LoraManager
from engine.model.attention import AttentionBackend, AttentionMetadata, StateTensors
from engine.model.config import ModelConfig
from engine.model.decoder import DecoderModel
from engine.model.shard import Shard, shard_config
from engine.model.stage import Stage
from engine.phases import phase
from engine.scheduler.plan import SchedulerOutput
from engine.scheduler.request import Request
from engine.step.batch import PersistentBatch, StepInputs
from engine.step.chunk_rows import ChunkRowLayout
from engine.step.graphs import eager_reason, estimate_graph_memory, graph_sizes, start_graphs
from engine.step.hybrid_states import HybridStates, hybrid_states, state_caches
from engine.step.memory_profile import BatchShape, measure_device_memory, profile_lengths
from engine.step.model_load import LoadedModel, load_model

log = logging.getLogger(__name__)
T = TypeVar("T")


class StepBroadcast(Protocol):
    """Hands each step's inputs to the other tensor-parallel ranks (engine.parallel)."""

    def step(self, inputs: StepInputs) -> AbstractContextManager[None]:
        """Send ``inputs``; rank 0's forward runs inside (a failed rank raises there)."""
        ...

    def call_runners(self, fn: Callable[[Any, Any], T], runner: Any, arg: object) -> list[T]:
        """``fn(runner, arg)`` on every rank's runner (this one's ``runner``), between
        steps; the answers in rank order."""
        ...


class StagePipe(Protocol):
    """A pipeline stage's link to the others (engine.parallel.pipeline)."""

    stage: Stage

    def forward(
        self, model: DecoderModel, inputs: StepInputs, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        """The step through this stage's layers; the logits on rank 0."""
        ...

    def min_int(self, value: int) -> int:
        """The smallest ``value`` over every rank."""
        ...


class ModelRunner:
    """The model's weights, the node's KV cache tensor, and one forward per step."""

    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        attention: AttentionBackend | None = None,
        *,
        loaded: LoadedModel | None = None,
        shared_caches: Sequence[SharedCache] = (),
        chunk_rows: ChunkRowLayout | None = None,
        shard: Shard | None = None,
        ranks: StepBroadcast | None = None,
        pipe: StagePipe | None = None,
    ) -> None:
        """`loaded`: the weights, already on the device (else loaded here, with `attention`).
        `shared_caches`: caches to be allocated with this cache's block count (a draft
        model's); the KV budget is shared with them (engine.kv.sizing).
        `chunk_rows`: lays some chunks out as decode rows (engine.step.chunk_rows).
        `shard`: the tensor-parallel rank this runner is (every rank's runner is built
        alike, the block count agreed on); `ranks`: on rank 0, sends each step's inputs to
        the other ranks (engine.parallel); `pipe`: this rank's pipeline stage, whose layers
        and KV cache it holds, and its link to the other stages."""
        self.config = config
        self.model_config = model_config
        self.device = torch.device(config.device)
        if loaded is None:
            loaded = load_model(
                config, model_config, attention, shard, pipe.stage if pipe is not None else None
            )
        self.max_model_len = loaded.max_model_len
        self.model = loaded.model
        self.packed_weights = loaded.packed_weights
        self.layout = loaded.layout
        self.lora = lora_manager(config, model_config, self.model)
        self.ranks = ranks
        self.pipe = pipe
        self.max_blocks = -(-self.max_model_len // config.block_size)  # the widest table
        self.memory: DeviceMemory | None = None  # as measured for the KV plan (CUDA)
        self.eager_reason = eager_reason(config, self.device, self.model, pipe is not None)
        linear = model_config.linear
        if linear is not None:  # the state pool's bytes (this rank's) come off the KV budget
            local = shard_config(model_config, shard or Shard()).linear
            assert local is not None
            shared_caches = (*shared_caches, *state_caches(config, local))
        with phase("kv_cache"):
            self.kv_capacity = plan_kv_cache(
                config, self.layout, self._measure_memory, shared_caches
            )
            self.num_blocks = (shard or Shard()).min_int(self.kv_capacity.num_blocks)
            if pipe is not None:  # one block count for every stage: the scheduler's
                self.num_blocks = pipe.min_int(self.num_blocks)
            # kv_cache: [num_blocks, num_layers, 2, block_size, kv_heads, head_dim]
            self.kv_cache = allocate_kv_cache(self.layout, self.num_blocks, self.device)
            # a hybrid model's: the pool of per-request states, preempted requests' states
            # in host memory (they swap with the blocks, to the host tier), checkpoints
            self.hybrid: HybridStates | None = None
            if linear is not None:
                self.hybrid = hybrid_states(config, model_config, shard, self.device)
        self.states = self.hybrid.pool if self.hybrid is not None else None
        self.state_swap = self.hybrid.swap if self.hybrid is not None else None
        self.max_blocks = min(self.max_blocks, self.num_blocks)
        self.batch = PersistentBatch(
            config.max_num_seqs,
            self.max_blocks,
            config.block_size,
            model_config.vocab_size,
            self.device,
            chunk_rows=chunk_rows,
        )
        self.graphs = start_graphs(
            config, self.model, self.kv_cache, self.max_blocks, self.lora, self.eager_reason
        )

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> torch.Tensor:
        """Run one step; float32 logits [sampled rows, vocab]: decodes, then the sampled
        prefill chunks, in order.

        Computes K/V for every scheduled token into the cache, and the LM head only for the
        last token of chunks with ``sample`` set.
        """
        return self.forward(self.prepare(out))

    def prepare(
        self, out: SchedulerOutput, sampled_prefills: Sequence[Request] | None = None
    ) -> StepInputs:
        """The step's input tensors, on the device (see PersistentBatch.prepare)."""
        if out.is_empty:
            raise ValueError("execute() needs at least one scheduled chunk")
        inputs = self.batch.prepare(out, sampled_prefills)
        self._check_lengths(inputs.meta)
        if self.hybrid is not None:
            meta = dataclasses.replace(inputs.meta, states=self.hybrid.step(out))
            inputs = inputs._replace(meta=meta)
        if self.lora is not None:
            inputs = inputs._replace(lora=lora_batch(self.lora, out))
        return inputs

    def release(self, request_id: str) -> None:
        """The request left the running batch: free its row and its states
        (engine.step.hybrid_states)."""
        self.batch.release(request_id)
        if self.hybrid is not None:
            self.hybrid.release(request_id)

    @property
    def state_blocks(self) -> int:
        """KV blocks a request's linear-attention state record takes (0: no such layer)."""
        if self.states is None:
            return 0
        return self.states.record_blocks(self.layout.block_bytes // self.layout.num_kv_heads)

    def park_state(self, request: Request, blocks: BlockManager) -> None:
        """Prefill role: the pinned request's linear-attention states (every rank's share)
        into KV blocks at the end of its table, leased and shipped with the prompt's. None
        are written when the cache is short of blocks or a share does not fit (the decode
        node then finds no record and recomputes)."""
        states, n, rid = self.states, self.state_blocks, request.request_id
        if states is None or not states.holds(rid):
            return
        if not blocks.allocate(request, (len(request.block_ids) + n) * blocks.block_size):
            log.warning("state_not_parked id=%s blocks=%d", rid, n)
            return
        call = StateCall(states.slot(rid), rid, tuple(request.block_ids[-n:]))
        if not all(self._on_ranks(save_share, call)):
            log.warning("state_not_parked id=%s reason=share_too_large", rid)

    def load_state(self, request_id: str, block_ids: list[int]) -> str | None:
        """Decode role: an imported request's states from the record at the end of its
        table (``park_state``'s) into its slot on every rank; why it is refused (the slot
        given back), or None."""
        if self.states is None:
            return None
        call = StateCall(self.states.slot(request_id), request_id,
                         tuple(block_ids[-self.state_blocks :]))  # fmt: skip
        why = next((w for w in self._on_ranks(load_share, call) if w is not None), None)
        if why is not None:
            self.states.release(request_id)
        return why

    def _on_ranks(self, fn: Callable[[ModelRunner, Any], T], arg: object) -> list[T]:
        """``fn(runner, arg)`` on this runner and on every other rank's (in step order)."""
        return [fn(self, arg)] if self.ranks is None else self.ranks.call_runners(fn, self, arg)

    @torch.inference_mode()
    def forward(self, inputs: StepInputs) -> torch.Tensor:
        """float32 logits [sampled rows, vocab] of a prepared step."""
        if self.lora is not None:
            self.lora.bind(inputs.lora)
        if self.ranks is None:
            return self._forward(inputs)
        with self.ranks.step(inputs):
            return self._forward(inputs)

    def _forward(self, inputs: StepInputs) -> torch.Tensor:
        states, hybrid = inputs.meta.states, self.hybrid
        if states is not None and hybrid is not None and states.conv is not hybrid.pool.conv:
            # another rank's step (engine.parallel.messages): this rank's tensors, same slots
            own = states.on(StateTensors(hybrid.pool.conv, hybrid.pool.recurrent), hybrid.saved)
            inputs = inputs._replace(meta=dataclasses.replace(inputs.meta, states=own))
        if self.pipe is not None:
            return self.pipe.forward(self.model, inputs, self.kv_cache).float()
        if self.graphs is not None and (replayed := self.graphs.run(inputs)) is not None:
            return replayed.float()
        logits = self.model(inputs.input_ids, inputs.meta, self.kv_cache, inputs.logits_indices)
        return logits.float()

    def _measure_memory(self) -> DeviceMemory:
        """The GPU's memory around a forward of the largest step, and what the decode graphs
        will hold (engine.step.memory_profile)."""
        c = self.config
        lengths = profile_lengths(c.max_num_batched_tokens, c.max_num_seqs, self.max_model_len)
        shape = BatchShape(c.max_num_seqs, self.max_blocks, self.model_config.vocab_size)
        self.memory = measure_device_memory(
            self.model, self.layout, lengths, self.device, shape, self._graph_estimate()
        )
        return self.memory

    def _graph_estimate(self) -> Callable[[], int] | None:
        """What measures the graphs' memory before the KV plan (None: no graphs)."""
        if self.eager_reason is not None:
            return None
        sizes = graph_sizes(self.config)
        model, layout, blocks, lora = self.model, self.layout, self.max_blocks, self.lora
        return lambda: estimate_graph_memory(model, layout, sizes, blocks, lora)

    def _check_lengths(self, meta: AttentionMetadata) -> None:
        longest = max(meta.context_lens_host)
        if longest > self.max_model_len:
            raise ValueError(
                f"a chunk reaches position {longest}, beyond max_model_len {self.max_model_len}"
            )


class StateCall(NamedTuple):
    """A request's state slot (rank 0's number, every rank's) and its record's blocks."""

    slot: int
    request_id: str
    blocks: tuple[int, ...]


def save_share(runner: ModelRunner, call: StateCall) -> bool:
    """This rank's share of the slot into the record (False: it does not fit)."""
    assert runner.states is not None
    return runner.states.save(call.slot, call.request_id, call.blocks, runner.kv_cache)


def load_share(runner: ModelRunner, call: StateCall) -> str | None:
    """This rank's share of the record into the slot; why it is refused, or None."""
    assert runner.states is not None
    return runner.states.load(call.slot, call.request_id, call.blocks, runner.kv_cache)


def lora_batch(manager: LoraManager, out: SchedulerOutput) -> LoraBatch | None:
    """The step's LoRA batch: each row's adapter, decodes then prefill chunks."""
    return manager.prepare(
        [r.lora for r in out.decodes],
        [r.lora for r in out.prefill_requests],
        [c.num_tokens for c in out.prefills],
    )


def lora_manager(
    config: EngineConfig, model_config: ModelConfig, model: DecoderModel
) -> LoraManager | None:
    """The adapters' slots and hooks on the model's layers (None: LoRA is off)."""
    if not config.enable_lora:
        return None
    device = torch.device(config.device)
    kernel = choose_kernel(device, config.torch_dtype, config.cpu_kernels)
    return LoraManager(
        model, model_config, config.max_loras, config.max_lora_rank,
        config.max_cpu_loras or config.max_loras, kernel, device, config.torch_dtype,
    )  # fmt: skip
