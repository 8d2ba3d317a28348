"""Decode steps with and without CUDA graphs (engine.step.graphs), against the step's roofline.

    python -m bench.cuda_graphs [--random-model llama-1b] [--batches 64 256] [--steps 10]
                                [--prompt-len 256] [--out PATH]

For each mode (eager: ``enforce_eager``; graphs) one engine of the random-weight model
(bfloat16, sized by ``gpu_memory_utilization``, so the graphs' memory estimate is part of
its plan) admits each batch of prompts, runs until every row decodes, counts the kernel
launches of one step (host calls and device kernels, bench.launches), times ``steps``
steps, and keeps every row's greedy tokens. Reported per mode and batch: the median step,
its roofline (weights and KV bytes over a same-run copy; FLOPs over a same-run matmul,
bench.roofline) and their ratio; for the graphs their capture time and memory against the
estimate the KV plan kept; and how many rows' greedy tokens the two modes share (bfloat16:
the graphs plan the attention's key splits for the longest context, so sums differ in
order; fp32 equality is a GPU test). CUDA only: without it the benchmark says so, exit 2.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import (
    RESULTS_DIR,
    ModelShape,
    environment,
    matmul_peak_gflops,
    memcpy_gbps,
    write_json,
)
from bench.decode_step import COPY_BYTES, WARMUP_STEPS, DecodeTiming, decode_step_report
from bench.launches import count_launches
from bench.random_model import SHAPES, write_random_model_dir
from engine.config import EngineConfig
from engine.engine import LLMEngine
from models.sampling_params import SamplingParams

MODES = {"eager": True, "graphs": False}  # mode -> enforce_eager


def run_batch(engine: LLMEngine, prompts: list[list[int]], steps: int) -> dict[str, Any]:
    """Admit `prompts`, decode until every row is in the batch, count one step's launches,
    time `steps` steps; the rows' tokens so far are returned and the requests aborted."""
    params = SamplingParams(max_tokens=1 << 20, temperature=0.0, ignore_eos=True)
    ids = [f"g{i}" for i in range(len(prompts))]
    tokens: dict[str, list[int]] = {rid: [] for rid in ids}

    def step() -> int:
        outputs = engine.step()
        for out in outputs:
            tokens[out.request_id] += out.new_token_ids
        return len(outputs)

    for rid, prompt in zip(ids, prompts, strict=True):
        engine.add_request(rid, prompt, params)
    while step() < len(prompts):
        pass
    for _ in range(WARMUP_STEPS):
        step()
    launches = count_launches(step)
    context = sum(map(len, prompts)) + sum(map(len, tokens.values()))
    context += len(prompts) * (steps - 1) // 2  # the timed steps' mean
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    for rid in ids:
        engine.abort(rid)
    timing = DecodeTiming(len(prompts), steps, statistics.median(times), context)
    return {
        "timing": timing,
        "launches": launches._asdict(),
        "tokens": [tokens[rid] for rid in ids],
    }


def run_mode(
    model_dir: Path,
    prompts: list[list[int]],
    batches: list[int],
    steps: int,
    eager: bool,
    device: str = "cuda",
) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """One engine, every batch; its per-batch results and its start figures."""
    config = EngineConfig(
        model_dir=model_dir, dtype="bfloat16", device=device, load_format="random",
        max_num_seqs=max(batches), max_num_batched_tokens=8192, gpu_memory_utilization=0.5,
        enforce_eager=eager,
    )  # fmt: skip
    started = time.perf_counter()
    engine = LLMEngine(config)
    start = {"start_s": time.perf_counter() - started, **_graph_figures(engine)}
    results = {b: run_batch(engine, prompts[:b], steps) for b in batches}
    engine.close()
    del engine
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return results, start


def _graph_figures(engine: LLMEngine) -> dict[str, Any]:
    runner = engine.runner
    captured = runner.graphs.captured if runner.graphs is not None else None
    estimate = runner.memory.graphs if runner.memory is not None else 0
    figures: dict[str, Any] = {
        "kv_blocks": runner.num_blocks,
        "graph_estimate_gib": estimate / 2**30,
    }
    if captured is not None:
        figures |= {
            "graphs": captured.graphs,
            "capture_s": captured.seconds,
            "graph_memory_gib": captured.memory_bytes / 2**30,
        }
    return figures


def batch_entry(
    results: dict[str, dict[str, Any]], shape: ModelShape, traffic_gbps: float, peak: float
) -> dict[str, Any]:
    """One batch's figures: each mode's step against its roofline with its launches, the
    speed-up of the graphs and the rows whose greedy tokens the modes share."""
    entry: dict[str, Any] = {}
    for mode, result in results.items():
        step = decode_step_report(result["timing"], shape, torch.bfloat16, traffic_gbps, peak)
        entry[mode] = step | {"launches": result["launches"]}
    entry["greedy"] = same_tokens(results["eager"]["tokens"], results["graphs"]["tokens"])
    entry["speedup"] = entry["eager"]["median_step_s"] / entry["graphs"]["median_step_s"]
    return entry


def same_tokens(a: list[list[int]], b: list[list[int]]) -> dict[str, Any]:
    """How many rows two runs gave the same tokens (over the shorter of each pair)."""
    same = [x[: min(len(x), len(y))] == y[: min(len(x), len(y))] for x, y in zip(a, b, strict=True)]
    return {"rows": len(same), "same_rows": sum(same), "fraction": sum(same) / max(len(same), 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.cuda_graphs", description=__doc__, allow_abbrev=False)
    ap.add_argument("--random-model", choices=sorted(SHAPES), default="llama-1b")
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--steps", type=int, default=10, help="timed decode steps per batch")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "cuda_graphs.json")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.cuda_graphs: no CUDA device here; it times CUDA graphs")
        return 2
    tmp = tempfile.TemporaryDirectory()
    model_dir = write_random_model_dir(args.random_model, Path(tmp.name))
    shape = ModelShape.from_dir(model_dir)
    rng = random.Random(args.seed)
    prompts = [
        [rng.randrange(3, shape.vocab) for _ in range(args.prompt_len)]
        for _ in range(max(args.batches))
    ]
    traffic = [2 * memcpy_gbps(COPY_BYTES, device="cuda")]
    peak = matmul_peak_gflops(torch.bfloat16, n=4096, seconds=1.0, device="cuda")
    report: dict[str, Any] = {"benchmark": "cuda_graphs", "model": f"random:{args.random_model}"}
    runs: dict[str, Any] = {}
    for mode, eager in MODES.items():
        runs[mode] = run_mode(model_dir, prompts, args.batches, args.steps, eager)
    traffic.append(2 * memcpy_gbps(COPY_BYTES, device="cuda"))
    report |= {"copy_traffic_gb_s": max(traffic), "matmul_peak_gflop_s": peak}
    report |= {"start": {mode: runs[mode][1] for mode in MODES}, "batches": {}}
    for batch in args.batches:
        results = {mode: runs[mode][0][batch] for mode in MODES}
        entry = batch_entry(results, shape, max(traffic), peak)
        report["batches"][str(batch)] = entry
        print(describe(batch, entry))
    report["environment"] = environment()
    write_json(args.out, report)
    print(f"wrote {args.out}")
    return 0


def describe(batch: int, entry: dict[str, Any]) -> str:
    eager, graphs = entry["eager"], entry["graphs"]
    return (
        f"batch {batch}: eager {eager['median_step_s'] * 1e3:.2f} ms "
        f"({eager['launches']['host_calls']} launch calls), graphs "
        f"{graphs['median_step_s'] * 1e3:.2f} ms ({graphs['launches']['host_calls']}), "
        f"{entry['speedup']:.2f}x; graphs / roofline {graphs['step_over_roofline']:.2f}; "
        f"greedy rows alike {entry['greedy']['same_rows']}/{entry['greedy']['rows']}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
