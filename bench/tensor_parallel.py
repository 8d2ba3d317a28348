"""Tensor and pipeline parallelism on the CPU: N = TP x PP ranks of one thread each against
one rank of N threads, same workload, same run (``python -m bench.offline
--tensor-parallel-size TP --pipeline-parallel-size PP``).

The collectives' share is the time rank 0 spends in ``all_reduce`` and ``all_gather`` (the
sums after attention and the MLP, the vocabulary gather) over its whole run; it includes the
wait for the slower rank, so it bounds the cost of the sums from above. With pipeline stages
each stage's bubble is printed: the share of its forward time it waits on another stage (for
its input, for the logits, for its sends; ``engine.parallel.pipeline.StageTimes``). Order
A B B A, each keeps its faster run. The ratio to the matmul peak is offline.summarize's, per
run.
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


def parallel_main(
    args: argparse.Namespace,
    model_dir: Path,
    prompts: list[list[int]],
    run_engine: Callable[..., dict[str, Any]],
    options: dict[str, Any],
) -> dict[str, dict[str, Any]]:
    """The runs {"one_rank_threads_N": ..., "<tpT_ppP>_1_thread_each": ...}, A B B A."""
    tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
    n = tp * pp
    label = "_".join(f"{k}{v}" for k, v in (("tp", tp), ("pp", pp)) if v > 1)
    engine_args = (model_dir, prompts, args.new_tokens, args.dtype, args.device, args.budget)
    # the same weights on both sides: ranks hold no quantized weights yet, and "auto" would
    # give the one rank a GGUF directory's packed ones
    options = {"quantization": "none"} | options

    def one_rank() -> dict[str, Any]:
        torch.set_num_threads(n)
        return run_engine(*engine_args, **options)

    def ranks() -> dict[str, Any]:
        torch.set_num_threads(1)  # the ranks take the same number at their start
        timer = CollectiveTimer()
        with timer.attached():
            run = run_engine(
                *engine_args, tensor_parallel_size=tp, pipeline_parallel_size=pp, **options
            )
        torch.set_num_threads(n)
        share = timer.seconds / run["seconds"]
        return run | {"collective_seconds": timer.seconds, "collective_share": share}

    a1, b1, b2, a2 = one_rank(), ranks(), ranks(), one_rank()
    best_a = min(a1, a2, key=lambda r: r["seconds"])
    best_b = min(b1, b2, key=lambda r: r["seconds"])
    ratio = best_a["seconds"] / best_b["seconds"]
    sums = (  # without TP the only sum is the block count's, at the start: not a step's
        f"; collectives {100 * best_b['collective_share']:.1f}% of rank 0's time "
        f"({best_b['collective_seconds']:.2f} s)"
        if tp > 1
        else ""
    )
    print(
        f"{label}: {n} ranks x 1 thread: {best_b['seconds']:.2f} s against 1 rank x "
        f"{n} threads: {best_a['seconds']:.2f} s (same run): {ratio:.3f}x{sums}"
    )
    for stage in best_b.get("pipeline_stages", []):
        print(
            f"  stage {stage['stage']}: bubble {100 * stage['bubble']:.1f}% (waits "
            f"{stage['wait_s']:.2f} s of {stage['wall_s']:.2f} s in its forwards), "
            f"{stage['micro_batches'] / max(stage['steps'], 1):.2f} micro-batches per step"
        )
    best_b["speedup_over_one_rank"] = ratio
    return {f"one_rank_threads_{n}": best_a, f"{label}_1_thread_each": best_b}
