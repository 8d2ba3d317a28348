"""Host time of an engine decode step, phase by phase, against the same step's forward.

    python -m bench.step_overhead [--sequences 64,256] [--steps 40] [--out PATH]

A tiny random model (1 layer, hidden 64, vocab 512) makes the arithmetic of a step next to
nothing, so what is left is what the host spends around it: scheduling, building the
inputs, sampling, handing out the outputs. N sequences of 256 prompt tokens are prefilled,
then decode steps are timed, greedy and sampled (temperature 0.8, top-p 0.9, top-k 50, a
seed per request). Each row gives milliseconds per step: schedule, prepare, forward, sample,
output, overhead (everything but the forward) and step; every configuration runs twice in
the same process, with the engine's defaults ("new") and with the overlap switched off
("old": one sync per step before the next is planned), so the ratio between them is a
same-run A/B. The same figures
in CPU time of the engine's thread come with a `_cpu` suffix (`overhead_cpu_ms`, ...): on a
machine shared with other work, wall time also counts the time other processes held the
core, CPU time much less so.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, environment, write_json
from bench.random_model import write_random_model_dir

PROMPT_LEN = 256
BLOCK_SIZE = 16
WARMUP_STEPS = 5
MAX_BATCHED_TOKENS = 4096
SAMPLING: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0},
    "random": {"temperature": 0.8, "top_p": 0.9, "top_k": 50},
}
# EngineConfig fields of each variant: the overlapped step (a GPU's default; asked for here
# so that the CPU measures it too), and the synchronous step
VARIANTS: dict[str, dict[str, Any]] = {
    "new": {"async_scheduling": True},
    "old": {"async_scheduling": False},
}


def measure(
    model_dir: Path, sequences: int, sampling: str, options: dict[str, Any], steps: int
) -> dict[str, Any]:
    """One configuration: prefill `sequences` prompts, then time `steps` decode steps."""
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from models.sampling_params import SamplingParams

    # the first requests decode while the last ones prefill: room for those steps too, so
    # that all of them still run through the timed steps
    prefill_steps = -(-sequences * PROMPT_LEN // MAX_BATCHED_TOKENS)
    max_tokens = prefill_steps + WARMUP_STEPS + steps + 4
    blocks_per_seq = -(-(PROMPT_LEN + max_tokens) // BLOCK_SIZE)
    engine = LLMEngine(
        EngineConfig(
            model_dir=model_dir,
            load_format="random",
            block_size=BLOCK_SIZE,
            num_kv_blocks=sequences * blocks_per_seq + 1,
            max_num_seqs=sequences,
            max_num_batched_tokens=MAX_BATCHED_TOKENS,
            enable_prefix_caching=False,
            **options,
        )
    )
    for i in range(sequences):
        prompt = [(7 * i + 13 * j) % 500 + 10 for j in range(PROMPT_LEN)]
        params = SamplingParams(
            max_tokens=max_tokens, ignore_eos=True, seed=i, **SAMPLING[sampling]
        )
        engine.add_request(f"r{i}", prompt, params)
    started: set[str] = set()
    while len(started) < sequences:  # prefill: until every request has its first token
        started.update(o.request_id for o in engine.step())
    for _ in range(WARMUP_STEPS):
        engine.step()
    engine.timer.reset()
    engine.timer.enabled = True
    start, cpu_start = time.perf_counter(), time.thread_time()
    for _ in range(steps):
        engine.step_result()
    elapsed, cpu_elapsed = time.perf_counter() - start, time.thread_time() - cpu_start
    if engine.stats().running != sequences:
        raise RuntimeError(f"{engine.stats().running} of {sequences} sequences ran to the end")
    engine.timer.enabled = False
    phases, cpu = engine.timer.means_ms(), engine.timer.means_ms(cpu=True)
    step_ms, step_cpu_ms = 1e3 * elapsed / steps, 1e3 * cpu_elapsed / steps
    return {
        "sequences": sequences,
        "sampling": sampling,
        **{f"{phase}_ms": value for phase, value in phases.items()},
        "overhead_ms": step_ms - phases["forward"],
        "step_ms": step_ms,
        **{f"{phase}_cpu_ms": value for phase, value in cpu.items()},
        "overhead_cpu_ms": step_cpu_ms - cpu["forward"],
        "step_cpu_ms": step_cpu_ms,
    }


def run(sequences: list[int], steps: int, variants: dict[str, dict[str, Any]]) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_random_model_dir("tiny", Path(tmp) / "tiny")
        for n in sequences:
            for sampling in SAMPLING:
                for variant, options in variants.items():
                    row = {"variant": variant, **measure(model_dir, n, sampling, options, steps)}
                    rows.append(row)
                    print(_format(row), flush=True)
    return rows


def same_run_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """new / old overhead and step time of each configuration measured both ways."""
    by_key = {(r["variant"], r["sequences"], r["sampling"]): r for r in rows}
    ratios = []
    for (variant, n, sampling), new in by_key.items():
        old = by_key.get(("old", n, sampling))
        if variant == "new" and old is not None:
            ratios.append(
                {
                    "sequences": n,
                    "sampling": sampling,
                    "overhead_new_over_old": new["overhead_ms"] / old["overhead_ms"],
                    "step_new_over_old": new["step_ms"] / old["step_ms"],
                    "overhead_cpu_new_over_old": new["overhead_cpu_ms"] / old["overhead_cpu_ms"],
                }
            )
    return ratios


def _format(row: dict[str, Any]) -> str:
    phases = "  ".join(
        f"{key[:-3]} {row[key]:6.3f}"
        for key in ("schedule_ms", "prepare_ms", "forward_ms", "sample_ms", "output_ms")
    )
    return (
        f"{row['variant']:>3} {row['sequences']:4d} seqs {row['sampling']:>6}: {phases}  "
        f"overhead {row['overhead_ms']:6.3f}  step {row['step_ms']:6.3f} ms  "
        f"(CPU: overhead {row['overhead_cpu_ms']:6.3f}  step {row['step_cpu_ms']:6.3f})"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--sequences", default="64,256", help="running sequences, comma separated")
    ap.add_argument("--steps", type=int, default=40, help="timed decode steps per row")
    ap.add_argument("--variant", choices=[*VARIANTS, "both"], default="both")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier timings)")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "step_overhead.json")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    variants = VARIANTS if args.variant == "both" else {args.variant: VARIANTS[args.variant]}
    sequences = [int(s) for s in args.sequences.split(",")]
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    rows = run(sequences, args.steps, variants)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    ratios = same_run_ratios(rows)
    for r in ratios:
        print(
            f"{r['sequences']:4d} seqs {r['sampling']:>6}: overhead new/old "
            f"{r['overhead_new_over_old']:.3f}, step new/old {r['step_new_over_old']:.3f}, "
            f"CPU overhead new/old {r['overhead_cpu_new_over_old']:.3f}"
        )
    write_json(
        args.out,
        {
            "benchmark": "step_overhead",
            "environment": environment(),
            "rows": rows,
            "same_run_ratios": ratios,
            "load_average_1min_after": os.getloadavg()[0],
        },
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
