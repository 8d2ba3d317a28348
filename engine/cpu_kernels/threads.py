"""Threads beside the engine's that run torch ops on the CPU run them on one OpenMP thread.

libgomp keeps a worker pool for each thread that has run a parallel region, for as long as
that thread lives. With more pooled threads than cores it stops spinning between parallel
regions and sleeps at once, so each of the engine's ~200 parallel kernels a step pays a
futex wake-up: a node whose engine had been built in a long-lived executor thread decoded at
half speed (engine.loop.engine_loop). A long-lived helper thread that runs torch ops
(grammar masks, KV tier copies) calls `serial_torch_ops()` first: its own OpenMP thread
count becomes 1, its torch ops run inline and no pool is made. The count is per thread in
libgomp, so the engine thread's is untouched.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import torch


@functools.cache
def _set_omp_threads() -> Callable[[int], object] | None:
    try:  # torch's own runtime, already loaded: found by its soname
        function: Callable[[int], object] = ctypes.CDLL("libgomp.so.1").omp_set_num_threads
    except (OSError, AttributeError):  # another OpenMP runtime, or none
        return None
    return function


def serial_torch_ops() -> None:
    """Make this thread's torch CPU ops single-threaded (see the module)."""
    torch.get_num_threads()  # torch's per-thread setup first: it would set the count back
    set_threads = _set_omp_threads()
    if set_threads is not None:
        set_threads(1)
