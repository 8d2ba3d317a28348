"""Tensor parallelism on the CPU: N ranks of one thread each against one rank of N threads,
same workload, same run (``python -m bench.offline --tensor-parallel-size N``).

The collectives' share is the time rank 0 spends in ``all_reduce`` and ``all_gather`` (the
sums after attention and the MLP, the vocabulary gather) over its whole run; it includes the
wait for the slower rank, so it bounds the cost of the sums from above. Order A B B A, each
keeps its faster run. The ratio to the matmul peak is offline.summarize's, per run.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


class CollectiveTimer:
    """Seconds rank 0 spends in the collectives the model calls (this process only)."""

    NAMES = ("all_reduce", "all_gather")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    @contextmanager
    def attached(self) -> Iterator[CollectiveTimer]:
        originals = {name: getattr(dist, name) for name in self.NAMES}
        for name, fn in originals.items():
            setattr(dist, name, self._timed(fn))
        try:
            yield self
        finally:
            for name, fn in originals.items():
                setattr(dist, name, fn)

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1

        return timed


def tensor_parallel_main(
    args: argparse.Namespace,
    model_dir: Path,
    prompts: list[list[int]],
    run_engine: Callable[..., dict[str, Any]],
    options: dict[str, Any],
) -> dict[str, dict[str, Any]]:
    """The runs {"tp1_threads_N": ..., "tpN_1_thread_each": ...}, A B B A."""
    tp = args.tensor_parallel_size
    engine_args = (model_dir, prompts, args.new_tokens, args.dtype, args.device, args.budget)

    def one_rank() -> dict[str, Any]:
        torch.set_num_threads(tp)
        return run_engine(*engine_args, **options)

    def ranks() -> dict[str, Any]:
        torch.set_num_threads(1)  # the ranks take the same number at their start
        timer = CollectiveTimer()
        with timer.attached():
            run = run_engine(*engine_args, tensor_parallel_size=tp, **options)
        torch.set_num_threads(tp)
        share = timer.seconds / run["seconds"]
        return run | {"collective_seconds": timer.seconds, "collective_share": share}

    a1, b1, b2, a2 = one_rank(), ranks(), ranks(), one_rank()
    best_a = min(a1, a2, key=lambda r: r["seconds"])
    best_b = min(b1, b2, key=lambda r: r["seconds"])
    ratio = best_a["seconds"] / best_b["seconds"]
    print(
        f"tensor parallel {tp} ranks x 1 thread: {best_b['seconds']:.2f} s against 1 rank x "
        f"{tp} threads: {best_a['seconds']:.2f} s (same run): {ratio:.3f}x; collectives "
        f"{100 * best_b['collective_share']:.1f}% of rank 0's time "
        f"({best_b['collective_seconds']:.2f} s)"
    )
    best_b["speedup_over_one_rank"] = ratio
    return {f"tp1_threads_{tp}": best_a, f"tp{tp}_1_thread_each": best_b}
