"""Pipeline parallelism: a rank's place among the stages, each step's micro-batches through
them, and the share of time each stage waits (the bubble).

Global rank ``r`` of an engine of TP x PP ranks is tensor-parallel rank ``r % TP`` of stage
``r // TP`` (rank 0, the engine's process, is the first stage's). Every rank is handed the
whole step (``engine.parallel.group``) and cuts it into the same micro-batches
(``engine.parallel.micro_batch``). A stage runs micro-batch ``k`` as soon as its input is
there and sends its output on without waiting (``isend``), so stage ``s`` works on ``k``
while stage ``s + 1`` works on ``k - 1``: the hidden states go to the same tensor-parallel
rank of the next stage (after the stage's sums every rank of a stage holds them whole); the
last stage's tensor-parallel rank 0 sends each micro-batch's logits to rank 0, which samples.
The decoder keeps no residual apart from the hidden states, so they are all that moves.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from engine.config import EngineConfig
from engine.model.config import ModelConfig
from engine.model.decoder import DecoderModel
from engine.model.stage import Stage
from engine.parallel.micro_batch import split_step
from engine.step.batch import StepInputs


@dataclass
class StageTimes:
    """One rank's totals: time in its forwards (``wall_s``), of it computing (``busy_s``)
    and blocked on another stage (``wait_s``: for its input, for the logits, for its sends
    to be taken)."""

    stage: int
    tp_rank: int = 0
    steps: int = 0
    micro_batches: int = 0
    wall_s: float = 0.0
    busy_s: float = 0.0
    wait_s: float = 0.0

    @property
    def bubble(self) -> float:
        """The share of the stage's step time spent waiting on other stages."""
        return self.wait_s / self.wall_s if self.wall_s > 0 else 0.0


class StagePipe:
    """One rank's part of the pipeline; implements ``engine.step.runner.StagePipe``."""

    def __init__(
        self, stage: Stage, rank: int, tp: int, model_config: ModelConfig, config: EngineConfig
    ) -> None:
        self.stage = stage
        self.rank = rank
        self.micro_batches = stage.size  # enough to keep every stage busy once filled
        self.prev = None if stage.first else rank - tp
        self.next = None if stage.last else rank + tp
        self.head = (stage.size - 1) * tp  # the last stage's tensor-parallel rank 0
        self.returns_logits = rank == self.head
        self.hidden = model_config.hidden_size
        self.vocab = model_config.vocab_size
        self.dtype = config.torch_dtype
        self.device = torch.device(config.device)
        self.times = StageTimes(stage.index, rank % tp)

    def min_int(self, value: int) -> int:
        """The smallest ``value`` over every rank of every stage."""
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def forward(
        self, model: DecoderModel, inputs: StepInputs, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        """Run this stage's layers on each micro-batch of the step; on rank 0 the step's
        logits [sampled, vocab] (model dtype), elsewhere an empty tensor."""
        start = time.perf_counter()
        parts = split_step(inputs, self.micro_batches)
        sent: list[tuple[dist.Work | None, torch.Tensor]] = []
        for part in parts:
            hidden = None
            if self.prev is not None:  # hidden: [tokens, hidden] of the previous stage
                hidden = self._empty(part.input_ids.shape[0], self.hidden)
                self._recv(hidden, self.prev)
            busy = time.perf_counter()
            out = model(part.input_ids, part.meta, kv_cache, part.logits_indices, hidden)
            self.times.busy_s += time.perf_counter() - busy
            peer = self.next if self.next is not None else (0 if self.returns_logits else None)
            if peer is not None and out.numel():
                out = out.contiguous()
                sent.append((dist.isend(out, peer), out))
        logits = self._logits(parts) if self.rank == 0 else self._empty(0, self.vocab)
        for work, _ in sent:
            if work is not None:
                start_wait = time.perf_counter()
                work.wait()
                self.times.wait_s += time.perf_counter() - start_wait
        self.times.steps += 1
        self.times.micro_batches += len(parts)
        self.times.wall_s += time.perf_counter() - start
        return logits

    def _logits(self, parts: list[StepInputs]) -> torch.Tensor:
        """Rank 0: the micro-batches' logits from the last stage, in order."""
        out = []
        for part in parts:
            buf = self._empty(part.logits_indices.shape[0], self.vocab)
            if buf.numel():
                self._recv(buf, self.head)
            out.append(buf)
        return torch.cat(out) if len(out) > 1 else out[0]

    def _empty(self, rows: int, cols: int) -> torch.Tensor:
        return torch.empty(rows, cols, dtype=self.dtype, device=self.device)

    def _recv(self, buf: torch.Tensor, source: int) -> None:
        start = time.perf_counter()
        dist.recv(buf, source)
        self.times.wait_s += time.perf_counter() - start


def stage_pipe(config: EngineConfig, model_config: ModelConfig, rank: int) -> StagePipe | None:
    """Rank ``rank``'s part of the pipeline; None without pipeline parallelism."""
    pp, tp = config.pipeline_parallel_size, config.tensor_parallel_size
    if pp == 1:
        return None
    stage = Stage.of(model_config.num_hidden_layers, rank // tp, pp)
    return StagePipe(stage, rank, tp, model_config, config)
