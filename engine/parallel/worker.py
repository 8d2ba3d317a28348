"""A rank other than 0: its shard of its pipeline stage's model and KV cache, one forward
per step it is sent, until Stop."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist

from engine.config import EngineConfig
from engine.model.config import ModelConfig
from engine.parallel.messages import Report, RunnerCall, StepPlan, Stop
from engine.parallel.pipeline import StagePipe, stage_pipe
from engine.parallel.process_group import init_group, rank_device
from engine.parallel.watchdog import watch_parent
from engine.step.runner import ModelRunner

log = logging.getLogger(__name__)


def run_rank(
    config: EngineConfig,
    rank: int,
    port: int,
    parent_pid: int,
    threads: int,
    kv_pipe: Connection | None = None,
) -> None:
    """The process body of rank ``rank`` (spawned by ``engine.parallel.group.RankGroup``);
    its KV cache goes to rank 0 through ``kv_pipe``, which then carries rank 0's calls on
    it (``RankGroup.call_on_ranks``)."""
    watch_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the node's to handle
    torch.set_num_threads(threads)
    device = rank_device(config.device, rank)
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    shard = init_group(rank, config, port, device)
    try:
        config = _on(config, device)
        model_config = ModelConfig.from_dir(config.model_dir)
        pipe = stage_pipe(config, model_config, rank)
        runner = ModelRunner(config, model_config, shard=shard, pipe=pipe)
        if kv_pipe is not None:
            share_kv_cache(runner, kv_pipe, rank)
        serve(runner, pipe)
    except Exception:
        log.exception("engine rank %d failed", rank)
        sys.exit(1)
    dist.destroy_process_group()


def share_kv_cache(runner: ModelRunner, pipe: Connection, rank: int) -> None:
    """Send the rank's KV cache to rank 0: moved into shared memory first on the CPU (the
    cache is still empty), by CUDA IPC on a GPU; both processes then see the same blocks.
    Then answer rank 0's calls on the cache on a thread of this process (e.g. serving it to
    other nodes from here) until rank 0 closes the pipe."""
    if runner.kv_cache.device.type == "cpu":
        runner.kv_cache.share_memory_()
    pipe.send(runner.kv_cache)
    args = (runner.kv_cache, rank, pipe)
    threading.Thread(target=answer_calls, args=args, name="kv-calls", daemon=True).start()


def answer_calls(kv_cache: torch.Tensor, rank: int, pipe: Connection) -> None:
    """Run each ``(fn, arg)`` rank 0 sends as ``fn(kv_cache, rank, arg)``; send back
    ``("ok", answer)`` or ``("error", message)``."""
    while True:
        try:
            message = pipe.recv()
        except (EOFError, OSError):
            return
        except Exception as exc:  # a call that cannot be unpickled here
            pipe.send(("error", f"{type(exc).__name__}: {exc}"))
            continue
        fn, arg = message
        try:
            answer = ("ok", fn(kv_cache, rank, arg))
        except Exception as exc:
            log.exception("call on rank %d's KV cache failed", rank)
            answer = ("error", f"{type(exc).__name__}: {exc}")
        pipe.send(answer)


def serve(runner: ModelRunner, pipe: StagePipe | None = None) -> None:
    """Run the steps rank 0 broadcasts until it sends Stop."""
    while True:
        box: list[StepPlan | Report | RunnerCall | Stop | None] = [None]
        dist.broadcast_object_list(box, src=0)
        message = box[0]
        if isinstance(message, Stop):
            return
        if isinstance(message, Report):
            times = pipe.times if pipe is not None else None
            dist.gather_object(times, None, dst=0)
            continue
        if isinstance(message, RunnerCall):
            dist.gather_object(message.fn(runner, message.arg), None, dst=0)
            continue
        if not isinstance(message, StepPlan):
            raise TypeError(f"rank got {type(message).__name__}, not a step")
        runner.forward(message.inputs(runner.device))


def _on(config: EngineConfig, device: str) -> EngineConfig:
    import dataclasses

    return config if device == config.device else dataclasses.replace(config, device=device)
