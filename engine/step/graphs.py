"""CUDA graphs of the decode step: the model's forward captured at start for batch-size
buckets (engine.step.graph_inputs), replayed for every step whose rows are all plain decodes.

A decode step launches a few hundred small kernels; replayed from a graph they cost one
launch. Only the forward is captured (embedding to logits): the sampler, grammar masks and
speculative verification run after it as before, on its logits. Steps with prefill chunks
or with chunks laid out as decode rows (speculative guesses) run eagerly, as do steps wider
than the largest bucket. The graphs are captured largest first into one memory pool, after
the KV cache is allocated (they hold its address); what they take is estimated before the
KV plan by capturing the largest and the smallest bucket against a one-block scratch cache
(``estimate_graph_memory``), and the KV cache is sized around it (engine.kv.sizing).

With LoRA the graphs run the adapter kernels for every row (a row without an adapter has
slot ``NO_ADAPTER`` and adds nothing); adapters loaded later fill the same slot tensors.
Each tensor-parallel rank captures the same buckets (the all-reduces inside), and replays
the one rank 0's step names (``StepInputs.plain_decode`` travels with the step).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

import torch

from engine.config import EngineConfig, Role
from engine.kv.cache import KVLayout, allocate_kv_cache
from engine.kv.sizing import GIB
from engine.lora.delta import LoraBatch
from engine.lora.manager import LoraManager
from engine.model.decoder import DecoderModel
from engine.phases import phase
from engine.step.batch import StepInputs
from engine.step.graph_inputs import GraphInputs, bucket_for, capture_sizes

log = logging.getLogger(__name__)


def eager_reason(
    config: EngineConfig, device: torch.device, model: DecoderModel, pipelined: bool
) -> str | None:
    """Why this engine runs every step eagerly (None: it captures decode graphs)."""
    if config.enforce_eager:
        return "enforce_eager"
    if device.type != "cuda":
        return "cpu"
    if model.config.linear is not None:
        return "linear_attention"  # its states are read and written per sequence on the host
    if config.role is Role.PREFILL:
        return "prefill_role"  # it never decodes: a request is pinned after its first token
    if model.triton_ops is None:
        return "attention_backend_torch"  # the torch attention plans on the host
    if pipelined:
        return "pipeline_parallel"
    return None


def graph_sizes(config: EngineConfig) -> tuple[int, ...]:
    """The buckets: up to the most rows a decode step can have."""
    return capture_sizes(min(config.max_num_seqs, config.max_num_batched_tokens))


def graph_reserve(first: int, each_more: int, count: int) -> int:
    """Bytes to keep for ``count`` graphs in one pool: what the largest took, and what a
    second (the smallest) added to it for each other one."""
    return max(first, 0) + max(each_more, 0) * max(count - 1, 0)


class GraphCapture(NamedTuple):
    """What a capture took."""

    graphs: int
    seconds: float
    memory_bytes: int  # device memory held afterwards (pool and graph objects)


class DecodeGraphs:
    """The captured graphs of one model and KV cache, and their replay."""

    def __init__(
        self,
        model: DecoderModel,
        kv_cache: torch.Tensor,
        inputs: GraphInputs,
        lora: LoraManager | None = None,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.inputs = inputs
        self.lora = lora
        self.sizes: tuple[int, ...] = ()  # ascending: those captured
        self.captured: GraphCapture | None = None  # the latest capture's figures
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._logits: dict[int, torch.Tensor] = {}  # each graph's output [rows, vocab]
        self._pool: Any = None  # the graphs' memory pool, from the first captured

    @torch.inference_mode()
    def capture(self, sizes: Iterable[int]) -> GraphCapture:
        """Capture a graph per size, largest first, into the graphs' one pool."""
        device = self.kv_cache.device
        before = used_memory(device)
        started = time.perf_counter()
        wanted = sorted(set(sizes) - set(self._graphs), reverse=True)
        for rows in wanted:
            self._capture(rows)
        self.sizes = tuple(sorted(self._graphs))
        seconds = time.perf_counter() - started
        self.captured = GraphCapture(len(wanted), seconds, used_memory(device) - before)
        return self.captured

    def _capture(self, rows: int) -> None:
        if rows > self.inputs.max_rows:
            raise ValueError(f"a graph of {rows} rows exceeds the inputs' {self.inputs.max_rows}")
        inputs = self.inputs
        args = (inputs.input_ids[:rows], inputs.meta(rows), self.kv_cache)
        indices = inputs.logits_indices[:rows]
        self._bind(rows)
        try:
            self.model(*args, indices)  # compiles the kernels first; padding rows write nothing
            torch.cuda.synchronize(self.kv_cache.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                logits = self.model(*args, indices)  # [rows, vocab]
        finally:
            self._bind(None)
        self._pool = graph.pool()
        self._graphs[rows], self._logits[rows] = graph, logits

    def _bind(self, rows: int | None) -> None:
        """The LoRA batch the captured layers read: every row's slot from the inputs."""
        lora, slots = self.lora, self.inputs.token_slots
        if lora is None or slots is None:
            return
        every = tuple(range(lora.slots.num_slots))
        lora.bind(None if rows is None else LoraBatch(slots[:rows], every, every_matrix=True))

    def run(self, inputs: StepInputs) -> torch.Tensor | None:
        """Logits [rows, vocab] of a plain decode step by replay (no host sync); None when
        no graph takes the step (run it eagerly)."""
        if not inputs.plain_decode:
            return None
        rows = bucket_for(self.sizes, inputs.meta.num_decodes)
        if rows is None:
            return None
        d = self.inputs.load(inputs)
        return self._replay(rows)[:d]

    def _replay(self, rows: int) -> torch.Tensor:
        """Run the graph of ``rows`` rows on the inputs as loaded; its logits [rows, vocab]."""
        self._graphs[rows].replay()
        return self._logits[rows]

    def close(self) -> None:
        """Drop the graphs and their pool."""
        self._graphs.clear()
        self._logits.clear()
        self._pool = None
        self.sizes = ()


def used_memory(device: torch.device) -> int:
    """Device memory in use, cached blocks released first (CUDA)."""
    torch.cuda.synchronize(device)
    gc.collect()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def estimate_graph_memory(
    model: DecoderModel,
    layout: KVLayout,
    sizes: tuple[int, ...],
    max_blocks: int,
    lora: LoraManager | None,
) -> int:
    """Bytes the graphs of ``sizes`` will hold, measured before the KV cache exists: the
    largest and the smallest captured against a one-block scratch cache, then dropped."""
    device = model.norm.device
    before = used_memory(device)
    inputs = GraphInputs(sizes[-1], max_blocks, layout.block_size, device, lora is not None)
    buffers = used_memory(device) - before  # the input buffers, kept as long as the graphs
    scratch = allocate_kv_cache(layout, 1, device)
    graphs = DecodeGraphs(model, scratch, inputs, lora)
    first = graphs.capture(sizes[-1:]).memory_bytes
    second = graphs.capture(sizes[:1]).memory_bytes if len(sizes) > 1 else 0
    graphs.close()
    del graphs, inputs, scratch
    used_memory(device)
    return max(buffers, 0) + graph_reserve(first, second, len(sizes))


def start_graphs(
    config: EngineConfig,
    model: DecoderModel,
    kv_cache: torch.Tensor,
    max_blocks: int,
    lora: LoraManager | None,
    reason: str | None,
) -> DecodeGraphs | None:
    """The engine's decode graphs, captured now (None, logged with the reason: eager)."""
    if reason is not None:
        log.info("cuda_graphs off reason=%s", reason)
        return None
    sizes = graph_sizes(config)
    device = kv_cache.device
    inputs = GraphInputs(sizes[-1], max_blocks, config.block_size, device, lora is not None)
    graphs = DecodeGraphs(model, kv_cache, inputs, lora)
    with phase("cuda_graphs"):
        done = graphs.capture(sizes)
    log.info(
        "cuda_graphs sizes=%d largest=%d capture_s=%.2f memory_gib=%.3f",
        done.graphs, sizes[-1], done.seconds, done.memory_bytes / GIB,
    )  # fmt: skip
    return graphs
