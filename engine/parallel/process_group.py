"""Joining a multi-rank engine's ``torch.distributed`` group, on both sides: rank 0's
rendezvous store (engine.parallel.group) and the other ranks' (engine.parallel.worker); a
rank's device and tensor-parallel shard."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from engine.config import EngineConfig
from engine.model.shard import Shard
from engine.parallel.start import check_in

GROUP_TIMEOUT = timedelta(minutes=10)  # a collective's longest wait (a rank that hangs)


def master_store(config: EngineConfig) -> dist.TCPStore:
    """Rank 0's rendezvous store, on a port the kernel picks as it binds (so no other
    process can take it between the choice and the bind); the ranks join it at its port."""
    return dist.TCPStore(
        "127.0.0.1", 0, world_size(config), is_master=True,
        timeout=GROUP_TIMEOUT, wait_for_workers=False,
    )  # fmt: skip


def backend_for(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


def world_size(config: EngineConfig) -> int:
    return config.tensor_parallel_size * config.pipeline_parallel_size


def init_group(
    rank: int, config: EngineConfig, port: int, device: str, store: dist.Store | None = None
) -> Shard:
    """Join the group as global ``rank`` (through rank 0's ``store``, or at ``port`` where
    rank 0 serves it); its tensor-parallel shard, whose collectives take tensors on
    ``device`` and span the ranks of its pipeline stage (``engine.parallel.pipeline``
    numbers them)."""
    tp = config.tensor_parallel_size
    if store is None:
        store = dist.TCPStore("127.0.0.1", port, world_size(config), False, GROUP_TIMEOUT)
        check_in(store, rank)
    dist.init_process_group(
        backend_for(device),
        store=store,
        rank=rank,
        world_size=world_size(config),
        timeout=GROUP_TIMEOUT,
    )
    group = None  # one stage: the default group is the stage's
    if config.pipeline_parallel_size > 1 and tp > 1:  # every rank makes every stage's group
        stages = range(config.pipeline_parallel_size)
        groups = [dist.new_group(list(range(s * tp, (s + 1) * tp))) for s in stages]
        group = groups[rank // tp]
    return Shard(rank % tp, tp, group=group, device=device)


def rank_device(device: str, rank: int) -> str:
    """Rank ``r`` of a CUDA engine on GPU ``r`` (counted from the engine's own)."""
    if not device.startswith("cuda"):
        return device
    first = int(device.split(":")[1]) if ":" in device else 0
    return f"cuda:{first + rank}"
