"""Rank 0's side of a tensor-parallel engine: starts the other ranks, hands them each step,
watches them, and stops them.

The ranks are spawned processes joined in one ``torch.distributed`` group (gloo on the CPU,
NCCL on CUDA) over a free local port. They belong to the engine: a rank that exits makes
the next step (or the one running) raise ``RankFailed`` naming it, and calls the
``on_failure`` callbacks at once (an engine loop stops on it); ``close`` stops them, kills
those that do not stop, and a rank whose parent is gone exits by itself
(``engine.parallel.watchdog``). One multi-rank engine per process (the default group).
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from multiprocessing.process import BaseProcess
from typing import cast

import torch
import torch.distributed as dist

from engine.config import EngineConfig
from engine.model.shard import Shard
from engine.parallel.messages import StepPlan, Stop
from engine.step.batch import StepInputs

log = logging.getLogger(__name__)

GROUP_TIMEOUT = timedelta(minutes=10)  # a collective's longest wait (a rank that hangs)
_JOIN_S = 10.0  # a rank's time to exit after Stop before it is killed


class RankFailed(RuntimeError):
    """A tensor-parallel rank died or failed: the engine cannot step any more."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def backend_for(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


def init_group(rank: int, size: int, port: int, device: str) -> Shard:
    """Join the group as ``rank``; the shard's collectives take tensors on ``device``."""
    dist.init_process_group(
        backend_for(device),
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=size,
        timeout=GROUP_TIMEOUT,
    )
    return Shard(rank, size, device=device)


def rank_device(device: str, rank: int) -> str:
    """Rank ``r`` of a CUDA engine on GPU ``r`` (counted from the engine's own)."""
    if not device.startswith("cuda"):
        return device
    first = int(device.split(":")[1]) if ":" in device else 0
    return f"cuda:{first + rank}"


class RankGroup:
    """The ranks 1..N-1 of an engine of ``config.tensor_parallel_size`` N, and rank 0's
    ``shard``; implements ``engine.step.runner.StepBroadcast``."""

    def __init__(self, config: EngineConfig) -> None:
        from engine.parallel.worker import run_rank

        size = config.tensor_parallel_size
        if dist.is_initialized():
            raise RuntimeError("a tensor-parallel engine is already running in this process")
        port = free_port()
        spawn = multiprocessing.get_context("spawn")
        threads = torch.get_num_threads()
        self.processes: list[BaseProcess] = [
            spawn.Process(
                target=run_rank,
                args=(config, rank, size, port, os.getpid(), threads),
                name=f"tp-rank-{rank}",
                daemon=True,
            )
            for rank in range(1, size)
        ]
        for process in self.processes:
            process.start()
        self.failure: str | None = None
        self.on_failure: list[Callable[[str], None]] = []
        self._closing = False
        self._monitor = threading.Thread(target=self._watch, name="tp-monitor", daemon=True)
        self._monitor.start()
        try:
            self.shard = init_group(0, size, port, rank_device(config.device, 0))
        except Exception:
            self._kill()
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]

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

    def close(self) -> None:
        """Stop the ranks (Stop, then a kill for those still running); leave the group."""
        if self._closing:
            return
        self._closing = True
        if self.failure is None:
            try:
                self._broadcast(Stop())
            except Exception:
                log.warning("tensor-parallel ranks did not take Stop; killing them")
        for process in self.processes:
            process.join(_JOIN_S)
        self._kill()
        if dist.is_initialized():
            dist.destroy_process_group()

    def _broadcast(self, message: StepPlan | Stop) -> None:
        dist.broadcast_object_list([message], src=0)

    def _explain(self, exc: Exception) -> str:
        """The failure's message: the dead rank when one died (waited for briefly)."""
        for process in self.processes:
            process.join(2.0)
        dead = self._dead()
        if dead:
            return dead
        return f"tensor-parallel collective failed: {type(exc).__name__}: {exc}"

    def _dead(self) -> str | None:
        for rank, process in enumerate(self.processes, start=1):
            if process.exitcode is not None:
                return (
                    f"tensor-parallel rank {rank} (pid {process.pid}) exited with code "
                    f"{process.exitcode}; the engine cannot step any more"
                )
        return None

    def _watch(self) -> None:
        """Wait for any rank to exit; unless closing, record the failure and tell."""
        by_sentinel = {p.sentinel: p for p in self.processes}
        ready = multiprocessing.connection.wait(list(by_sentinel))
        if self._closing:
            return
        for sentinel in ready:  # its pipe closed: the exit code follows at once
            by_sentinel[cast(int, sentinel)].join(_JOIN_S)
        self.failure = self._dead() or "a tensor-parallel rank exited"
        log.error("%s", self.failure)
        for callback in list(self.on_failure):
            callback(self.failure)

    def _kill(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join(_JOIN_S)
