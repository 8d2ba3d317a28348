"""How many KV blocks a node allocates.

The first rule that applies:
- ``num_kv_blocks``: that many blocks.
- ``kv_cache_memory_gb``: as many blocks as that many GiB hold.
- on CUDA: ``gpu_memory_utilization`` of the device's total memory, minus the weights, the
  activation peak of a profiling forward and what the decode CUDA graphs will hold
  (engine.step.memory_profile measures all three), and never more than what is free on the
  device once room for the activations and the graphs is kept.
- on the CPU: 1 GiB.

Other caches may take as many blocks as this one and share its budget (`SharedCache`: a
draft model's KV cache keeps one block of its own layout per block). Every rule but
``num_kv_blocks`` then prices a block at this cache's bytes plus theirs, after their fixed
bytes; their weights are to be loaded before the measurement, which counts them.

The arithmetic is pure (``blocks_for_gpu``) so that it is tested against made-up memory
reports; the measurement that feeds it runs only on a GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.config import EngineConfig, check_fraction

if TYPE_CHECKING:
    from engine.kv.cache import KVLayout

log = logging.getLogger("splitserve.engine.kv.cache")

GIB = 2**30
CPU_DEFAULT_GIB = 1.0


@dataclass(frozen=True)
class DeviceMemory:
    """One GPU's memory as the sizing sees it, in bytes, taken after the weights are loaded
    and one profiling forward has run (and its activations were freed)."""

    total: int  # the device's memory
    free: int  # free on the device now: after our weights, CUDA contexts, other processes
    weights: int  # held by this process before the profiling forward (weights, rope tables)
    activation_peak: int  # most held above `weights` during the profiling forward
    graphs: int = 0  # to be held by the decode CUDA graphs (engine.step.graphs), 0: none

    @property
    def kept(self) -> int:
        """What the KV cache must leave free beside the weights: activations and graphs."""
        return self.activation_peak + self.graphs

    def __post_init__(self) -> None:
        for name in ("total", "free", "weights", "activation_peak", "graphs"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"DeviceMemory.{name} must be an integer >= 0, got {value!r}")
        if self.free > self.total:
            raise ValueError(f"DeviceMemory.free ({self.free}) exceeds total ({self.total})")


@dataclass(frozen=True)
class SharedCache:
    """Another cache allocated with this one's block count, from the same budget."""

    name: str  # in logs and errors: "draft"
    block_bytes: int  # per block
    fixed_bytes: int = 0  # whatever the block count

    def __post_init__(self) -> None:
        for field in ("block_bytes", "fixed_bytes"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"SharedCache.{field} must be an integer >= 0, got {value!r}")


@dataclass(frozen=True)
class KVCapacity:
    """The KV cache a node allocated and which rule sized it."""

    num_blocks: int
    block_size: int  # tokens per block
    block_bytes: int  # of this cache (the target's)
    sized_by: str  # num_kv_blocks | kv_cache_memory_gb | gpu_memory_utilization | cpu_default
    shared: tuple[SharedCache, ...] = ()  # caches of as many blocks from the same budget

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def num_bytes(self) -> int:
        """This cache's bytes (the one that transfers move), without the shared ones'."""
        return self.num_blocks * self.block_bytes

    @property
    def shared_block_bytes(self) -> int:
        """What the shared caches add to each block."""
        return sum(c.block_bytes for c in self.shared)

    @property
    def shared_bytes(self) -> int:
        return sum(self.num_blocks * c.block_bytes + c.fixed_bytes for c in self.shared)

    def describe(self) -> str:
        """One log line: blocks, tokens, GiB (and each shared cache's share)."""
        line = (
            f"blocks={self.num_blocks} tokens={self.num_tokens} "
            f"gib={self.num_bytes / GIB:.3f} sized_by={self.sized_by}"
        )
        if self.shared:
            sizes = "+".join(str(c.block_bytes) for c in self.shared)
            names = "+".join(c.name for c in self.shared)
            line += f" block_bytes={self.block_bytes}+{sizes} (target+{names})"
            for c in self.shared:
                line += (
                    f" {c.name}_gib={(self.num_blocks * c.block_bytes + c.fixed_bytes) / GIB:.3f}"
                )
        return line


def blocks_for_gpu(
    memory: DeviceMemory, fraction: float, block_bytes: int, shared: Sequence[SharedCache] = ()
) -> int:
    """Blocks of `block_bytes` (plus the `shared` caches' of as many blocks, after their
    fixed bytes) in ``fraction * total - weights - activation_peak - graphs``, capped by
    ``free - activation_peak - graphs``. ValueError naming the numbers when not even one
    fits."""
    check_fraction(fraction)
    share = int(fraction * memory.total) - memory.weights - memory.kept
    room = memory.free - memory.kept
    blocks = _blocks_in(min(share, room), block_bytes, shared)
    if blocks < 1:
        raise ValueError(
            f"no room for one KV block ({_block(block_bytes, shared)}): "
            f"gpu_memory_utilization {fraction} "
            f"x {_gib(memory.total)} total = {_gib(int(fraction * memory.total))}, minus weights "
            f"{_gib(memory.weights)}, activation peak {_gib(memory.activation_peak)} and CUDA "
            f"graphs {_gib(memory.graphs)} leaves {_gib(share)}; free on the device "
            f"{_gib(memory.free)}, minus the activation peak and graphs leaves {_gib(room)}. "
            "Raise gpu_memory_utilization, lower max_num_batched_tokens or max_num_seqs, "
            "set enforce_eager, or set num_kv_blocks / kv_cache_memory_gb"
        )
    return blocks


def blocks_for_gib(
    gib: float,
    block_bytes: int,
    setting: str = "kv_cache_memory_gb",
    shared: Sequence[SharedCache] = (),
) -> int:
    """Blocks of `block_bytes` (plus the `shared` caches' of as many blocks, after their
    fixed bytes) in `gib` GiB; ValueError when not even one fits."""
    blocks = _blocks_in(int(gib * GIB), block_bytes, shared)
    if blocks < 1:
        raise ValueError(
            f"KV cache budget of {gib:.6f} GiB holds no block of "
            f"{_block(block_bytes, shared)}; raise {setting} or set num_kv_blocks"
        )
    return blocks


def plan_kv_cache(
    config: EngineConfig,
    layout: KVLayout,
    measure: Callable[[], DeviceMemory],
    shared: Sequence[SharedCache] = (),
) -> KVCapacity:
    """The capacity for this engine; `measure` runs only when sized from the GPU (call this
    after the weights are loaded, the shared caches' owners' too). The `shared` caches,
    allocated with as many blocks, share every budget. Logs blocks, tokens and GiB."""
    bytes_per_block = layout.block_bytes
    if config.num_kv_blocks is not None:
        blocks, rule = config.num_kv_blocks, "num_kv_blocks"
    elif config.kv_cache_memory_gb is not None:
        blocks = blocks_for_gib(config.kv_cache_memory_gb, bytes_per_block, shared=shared)
        rule = "kv_cache_memory_gb"
    elif str(config.device).startswith("cuda"):
        memory = measure()
        figures = (memory.total, memory.free, memory.weights, memory.activation_peak, memory.graphs)
        log.info(
            "gpu_memory total_gib=%.2f free_gib=%.2f weights_gib=%.2f activation_peak_gib=%.2f "
            "cuda_graphs_gib=%.2f",
            *(v / GIB for v in figures),
        )
        blocks = blocks_for_gpu(memory, config.gpu_memory_utilization, bytes_per_block, shared)
        rule = "gpu_memory_utilization"
    else:
        blocks = blocks_for_gib(CPU_DEFAULT_GIB, bytes_per_block, shared=shared)
        rule = "cpu_default"
    capacity = KVCapacity(blocks, layout.block_size, bytes_per_block, rule, tuple(shared))
    log.info("kv_cache %s", capacity.describe())
    return capacity


def _blocks_in(budget: int, block_bytes: int, shared: Sequence[SharedCache]) -> int:
    fixed = sum(c.fixed_bytes for c in shared)
    return (budget - fixed) // (block_bytes + sum(c.block_bytes for c in shared))


def _block(block_bytes: int, shared: Sequence[SharedCache]) -> str:
    if not shared:
        return f"{block_bytes} bytes"
    total = block_bytes + sum(c.block_bytes for c in shared)
    parts = "".join(f" + {c.name} {c.block_bytes}" for c in shared)
    fixed = sum(c.fixed_bytes for c in shared)
    after = f", after {fixed} fixed bytes" if fixed else ""
    return f"{total} bytes: target {block_bytes}{parts}{after}"


def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:.2f} GiB"
