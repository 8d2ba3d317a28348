"""A decode step of the engine against its same-run roofline (bench.roofline).

Every prompt is admitted and prefilled; once a step has sampled every sequence, the batch
is all decodes, and `steps` further engine steps are timed one by one (host time included:
that is what the roofline is meant to expose). The median step is compared with the roofline
of a step at the mean context of the timed steps.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from bench.common import ModelShape, memcpy_gbps
from bench.roofline import decode_step_cost, roofline
from engine.config import engine_config
from engine.engine import LLMEngine
from models.sampling_params import SamplingParams

WARMUP_STEPS = 3  # decode steps run before the timed ones
COPY_BYTES = 1 << 30  # the copy that measures the device's traffic: far beyond its caches


@dataclass(frozen=True)
class DecodeTiming:
    """Timed decode steps of one batch."""

    batch: int
    steps: int
    median_step_s: float
    mean_context_tokens: int  # summed over the batch, the new token included


def time_decode_steps(engine: LLMEngine, prompts: list[list[int]], steps: int) -> DecodeTiming:
    """Admit `prompts`, run until all decode, then time `steps` decode steps; the requests
    are aborted after. The cache must hold every prompt and its decodes (no preemption)."""
    batch = len(prompts)
    # runs until aborted (or the context is full)
    params = SamplingParams(max_tokens=engine.max_model_len, temperature=0.0, ignore_eos=True)
    ids = [f"decode-probe-{i}" for i in range(batch)]
    for rid, prompt in zip(ids, prompts, strict=True):
        engine.add_request(rid, prompt, params)
    generated = 0
    while len(outputs := engine.step()) < batch:  # prefill, until every sequence is sampled
        generated += len(outputs)
        if not engine.has_unfinished():
            raise RuntimeError("the batch finished before it decoded")
    generated += batch
    for _ in range(WARMUP_STEPS):
        generated += _full_step(engine, batch)
    context_start = sum(len(p) for p in prompts) + generated
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        _full_step(engine, batch)
        times.append(time.perf_counter() - start)
    for rid in ids:
        engine.abort(rid)
    mean_context = context_start + batch * (steps - 1) // 2
    return DecodeTiming(batch, steps, statistics.median(times), mean_context)


def describe(report: dict[str, Any]) -> str:
    """One line for the console."""
    return (
        f"decode step: batch {report['batch']}, {report['mean_context_tokens']} context tokens: "
        f"median {report['median_step_s'] * 1e3:.2f} ms, roofline "
        f"{report['roofline_s'] * 1e3:.2f} ms ({report['bound']}-bound: "
        f"{report['weight_bytes'] / 1e9:.2f} GB weights + {report['kv_bytes'] / 1e9:.2f} GB KV at "
        f"{report['copy_traffic_gb_s']:.0f} GB/s, {report['flops'] / 1e9:.1f} GFLOP at "
        f"{report['matmul_peak_gflop_s']:.0f} GFLOP/s); step / roofline "
        f"{report['step_over_roofline']:.2f}"
    )


def _full_step(engine: LLMEngine, batch: int) -> int:
    """One engine step that must decode every sequence of the batch."""
    n = len(engine.step())
    if n != batch:
        raise RuntimeError(f"a decode step sampled {n} of {batch} sequences (KV cache too small?)")
    return n


def measure_decode_step(
    model_dir: Path,
    prompts: list[list[int]],
    dtype: str,
    device: str,
    budget: int,
    steps: int,
    matmul_gflops: float,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Time decode steps of `prompts` on `device` (KV cache sized by the engine's default)
    and compare with the roofline from the same-run copy traffic and `matmul_gflops`;
    `options`: other engine settings (``load_format="random"`` for a random-weight shape)."""
    traffic = [2 * memcpy_gbps(COPY_BYTES, device=device)]
    engine = LLMEngine(
        engine_config(
            model_dir, device=device, dtype=dtype, max_num_seqs=len(prompts),
            max_num_batched_tokens=budget, **(options or {}),
        )
    )  # fmt: skip
    timing = time_decode_steps(engine, prompts, steps)
    model_dtype = engine.config.torch_dtype
    del engine  # its cache leaves room for the second copy measurement
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    traffic.append(2 * memcpy_gbps(COPY_BYTES, device=device))
    shape = ModelShape.from_dir(model_dir)
    return decode_step_report(timing, shape, model_dtype, max(traffic), matmul_gflops)


def decode_step_report(
    timing: DecodeTiming,
    shape: ModelShape,
    dtype: torch.dtype,
    traffic_gbps: float,
    matmul_gflops: float,
) -> dict[str, Any]:
    """The timing against its roofline, as JSON-ready numbers."""
    cost = decode_step_cost(shape, timing.batch, timing.mean_context_tokens, dtype.itemsize)
    limit = roofline(cost, traffic_gbps, matmul_gflops)
    return {
        **asdict(timing),
        **asdict(cost),
        "copy_traffic_gb_s": traffic_gbps,
        "matmul_peak_gflop_s": matmul_gflops,
        "roofline_s": limit.seconds,
        "roofline_memory_s": limit.memory_s,
        "roofline_compute_s": limit.compute_s,
        "bound": limit.bound,
        "step_over_roofline": timing.median_step_s / limit.seconds,
    }
