"""Rank 0's side of a multi-rank engine (tensor and pipeline parallel): starts the other
ranks, hands them each step, watches them, and stops them.

The ranks are spawned processes joined in one ``torch.distributed`` group (gloo on the CPU,
NCCL on CUDA) through rank 0's store on a local port. They belong to the engine: a rank that
exits while the engine starts fails the start at once (``engine.parallel.start``); one that
exits later makes the next step (or the one running) raise ``RankFailed`` naming it, and calls
the ``on_failure`` callbacks at once (an engine loop stops on it); ``close`` stops them, kills
those that do not stop, and a rank whose parent is gone exits by itself
(``engine.parallel.watchdog``). One multi-rank engine per process (the default group): close
one before starting the next.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from engine.config import EngineConfig
from engine.model.config import ModelConfig
from engine.parallel.messages import Report, RunnerCall, StepPlan, Stop
from engine.parallel.pipeline import StagePipe, StageTimes, stage_pipe
from engine.parallel.process_group import (
    GROUP_TIMEOUT,
    init_group,
    master_store,
    rank_device,
    world_size,
)
from engine.parallel.start import await_ranks, exit_message, reap, refuse_unguarded_start
from engine.step.batch import StepInputs

log = logging.getLogger(__name__)

T = TypeVar("T")
RankCall = Callable[[torch.Tensor, int, Any], T]  # (the rank's KV cache, its rank, an arg)

_JOIN_S = 10.0  # a rank's time to exit after Stop before it is killed
_BROKEN = "the engine cannot step any more"
_NOT_STARTED = "the engine did not start"


class RankFailed(RuntimeError):
    """A rank (tensor-parallel, or of a pipeline stage) died or failed: the engine cannot
    step any more."""


class RankGroup:
    """The ranks 1..N-1 of an engine of N = TP x PP ranks, rank 0's ``shard`` and (with
    pipeline stages) its ``pipe``; implements ``engine.step.runner.StepBroadcast``."""

    def __init__(self, config: EngineConfig) -> None:
        from engine.parallel.worker import run_rank

        refuse_unguarded_start()
        size = world_size(config)
        self.tensor_parallel_size = config.tensor_parallel_size
        self.pipe: StagePipe | None = stage_pipe(config, ModelConfig.from_dir(config.model_dir), 0)
        if dist.is_initialized():
            raise RuntimeError(
                "a multi-rank engine is already running in this process: close it first "
                "(LLM.close(), or leave its `with LLM(...)` block; LLMEngine.close())"
            )
        store = master_store(config)
        port = store.port
        spawn = multiprocessing.get_context("spawn")
        threads = torch.get_num_threads()
        # each rank hands rank 0 its KV tensor (shared memory / CUDA IPC) for the transfer
        # agent, then answers calls on it (call_on_ranks)
        pipes = [spawn.Pipe(duplex=True) for _ in range(1, size)]
        self._kv_pipes = [receiver for receiver, _ in pipes]
        self._kv_caches: list[torch.Tensor] | None = None
        self.processes: list[BaseProcess] = [
            spawn.Process(
                target=run_rank,
                args=(config, rank, port, os.getpid(), threads, pipes[rank - 1][1]),
                name=f"engine-rank-{rank}",
                daemon=True,
            )
            for rank in range(1, size)
        ]
        for process in self.processes:
            process.start()
        for _, sender in pipes:
            sender.close()  # the ranks hold the sending ends
        self.failure: str | None = None
        self.on_failure: list[Callable[[str], None]] = []
        self._closing = False
        try:
            await_ranks(store, self.processes, GROUP_TIMEOUT.total_seconds(), self._start_failed)
            self.shard = init_group(0, config, port, rank_device(config.device, 0), store)
        except BaseException:  # Ctrl-C too: no rank outlives a start that did not finish
            self._end()
            raise
        self._monitor = threading.Thread(target=self._watch, name="tp-monitor", daemon=True)
        self._monitor.start()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]

    def kv_caches(self, timeout_s: float = 60.0) -> list[torch.Tensor]:
        """Ranks 1..N-1's KV cache tensors, the same memory the ranks write (shared memory on
        the CPU, CUDA IPC on GPUs); each rank sends it once its cache is allocated. RankFailed
        when a rank is gone or does not send it within ``timeout_s``."""
        if self._kv_caches is None:
            caches = []
            for rank, pipe in enumerate(self._kv_pipes, start=1):
                if not pipe.poll(timeout_s):
                    raise RankFailed(self._dead() or f"rank {rank} sent no KV cache")
                try:
                    caches.append(pipe.recv())
                except EOFError:
                    raise RankFailed(self._dead() or f"rank {rank} closed its pipe") from None
            self._kv_caches = caches
        return self._kv_caches

    def call_on_ranks(
        self, fn: RankCall[T], args: Sequence[object], timeout_s: float = 60.0
    ) -> list[T]:
        """``fn(kv_cache, rank, args[rank - 1])`` run in the process of each rank 1..N-1 (a
        module-level function: it travels by name), on its own KV cache; their answers.
        RankFailed when a rank raises, is gone, or does not answer within ``timeout_s``."""
        self.kv_caches(timeout_s)
        if len(args) != len(self._kv_pipes):
            raise ValueError(f"{len(args)} arguments for {len(self._kv_pipes)} ranks")
        for pipe, arg in zip(self._kv_pipes, args, strict=True):
            pipe.send((fn, arg))
        answers = []
        for rank, pipe in enumerate(self._kv_pipes, start=1):
            if not pipe.poll(timeout_s):
                raise RankFailed(self._dead() or f"rank {rank} did not answer a call")
            try:
                status, answer = pipe.recv()
            except EOFError:
                raise RankFailed(self._dead() or f"rank {rank} closed its pipe") from None
            if status != "ok":
                raise RankFailed(f"rank {rank} failed a call on its KV cache: {answer}")
            answers.append(answer)
        return answers

    def send_step(self, inputs: StepInputs) -> None:
        self._broadcast(StepPlan.of(inputs))

    @contextmanager
    def step(self, inputs: StepInputs) -> Iterator[None]:
        """Send ``inputs`` to the ranks, run rank 0's forward inside; a collective that
        fails because a rank is gone raises ``RankFailed`` naming it."""
        if self.failure is not None:
            raise RankFailed(self.failure)
        try:
            self.send_step(inputs)
            yield
        except RankFailed:
            raise
        except Exception as exc:
            raise RankFailed(self._explain(exc)) from exc

    def stage_times(self) -> list[StageTimes]:
        """Each pipeline stage's times so far (its tensor-parallel rank 0's); [] without
        stages."""
        if self.pipe is None:
            return []
        if self.failure is not None:
            raise RankFailed(self.failure)
        self._broadcast(Report())
        every: list[StageTimes | None] = [None] * (len(self.processes) + 1)
        dist.gather_object(self.pipe.times, every, dst=0)
        return [t for t in every if t is not None and t.tp_rank == 0]

    def call_runners(self, fn: Callable[[Any, Any], T], runner: Any, arg: object) -> list[T]:
        """``fn(runner, arg)`` on every rank's ModelRunner, in order with the steps (a
        module-level function: it travels by name), rank 0's ``runner`` after the others
        have been sent the call, so that ``fn`` may run collectives; the answers in rank
        order. RankFailed when a rank is gone."""
        if self.failure is not None:
            raise RankFailed(self.failure)
        every: list[Any] = [None] * (len(self.processes) + 1)
        try:
            self._broadcast(RunnerCall(fn, arg))
        except Exception as exc:
            raise RankFailed(self._explain(exc)) from exc
        try:
            mine, error = fn(runner, arg), None
        except Exception as exc:  # the ranks' answers still to collect: the group stays usable
            mine, error = None, exc
        try:
            dist.gather_object(None, every, dst=0)
        except Exception as exc:
            raise RankFailed(self._explain(exc)) from exc
        if error is not None:
            raise error
        return [mine, *every[1:]]

    def close(self) -> None:
        """Stop the ranks (Stop, then a kill for those still running); leave the group."""
        if self._closing:
            return
        self._closing = True
        if self.failure is None:
            try:
                self._broadcast(Stop())
            except Exception:
                log.warning("engine ranks did not take Stop; killing them")
        for process in self.processes:
            process.join(_JOIN_S)
        self._end()

    @contextmanager
    def starting(self) -> Iterator[None]:
        """Rank 0's part of the engine's start (its runner built, the KV block count agreed
        with the ranks): on an error the ranks are killed, and an error of the group (a
        RuntimeError) raised because a rank exited is ``RankFailed`` naming that rank."""
        try:
            yield
        except BaseException as exc:
            failed = isinstance(exc, RuntimeError)  # a collective, not rank 0's own checks
            dead = self._dead_after(_NOT_STARTED) if failed else None
            self._end()
            if dead is not None:
                raise RankFailed(dead) from exc
            raise

    def _broadcast(self, message: StepPlan | Report | RunnerCall | Stop) -> None:
        dist.broadcast_object_list([message], src=0)

    def _explain(self, exc: Exception) -> str:
        """The failure's message: the dead rank when one died (waited for briefly)."""
        dead = self._dead_after()
        if dead:
            return dead
        return f"multi-rank step failed: {type(exc).__name__}: {exc}"

    def _dead_after(self, consequence: str = _BROKEN) -> str | None:
        """``_dead`` once the ranks had a moment to exit (an error of the group shows as
        soon as a rank's connections close, its exit code a moment later)."""
        for process in self.processes:
            process.join(2.0)
        return self._dead(consequence)

    def _dead(self, consequence: str = _BROKEN) -> str | None:
        for rank, process in enumerate(self.processes, start=1):
            if process.exitcode is not None:
                return exit_message(self._role(rank), rank, process, consequence)
        return None

    def _start_failed(self) -> RankFailed:
        return RankFailed(self._dead(_NOT_STARTED) or "an engine rank exited")

    def _role(self, rank: int) -> str:
        """What a rank is, for errors: ``tensor-parallel`` or its pipeline stage."""
        if self.pipe is None:
            return "tensor-parallel"
        tp = self.tensor_parallel_size
        return f"pipeline stage {rank // tp} (tensor-parallel rank {rank % tp}):"

    def _watch(self) -> None:
        """Wait for any rank to exit; unless closing, record the failure and tell."""
        multiprocessing.connection.wait([p.sentinel for p in self.processes])
        if self._closing:
            return
        reap(self.processes)
        self.failure = self._dead() or "an engine rank exited"
        log.error("%s", self.failure)
        for callback in list(self.on_failure):
            callback(self.failure)

    def _end(self) -> None:
        """Kill the ranks still running (quietly: the monitor stands down) and leave the
        group."""
        self._closing = True
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join(_JOIN_S)
        if dist.is_initialized():
            dist.destroy_process_group()
