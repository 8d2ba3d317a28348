"""Offline throughput of the engine against the same-run matmul peak (and, optionally, HF).

    python -m bench.offline [--model smollm2] [--compare-hf] [--compare-sync] [--int8-activations]
                            [--compare-vllm PYTHON (bench.references)]
                            [--random-model NAME (bench.random_model.SHAPES)] [--out PATH]
                            [--tensor-parallel-size N] [--pipeline-parallel-size N]
                            (bench.tensor_parallel)

On CUDA it also times decode steps of the whole batch against their same-run roofline
(bench.decode_step).

Workload: N requests with prompt lengths uniform in [min_len, max_len] (seeded random token
ids), a fixed number of output tokens each, ignore_eos, greedy. --random-model benchmarks a
published shape with random weights made on the device (no checkpoint to download);
--compare-sync also runs the engine without overlapped scheduling in the same process, in
the order overlapped, synchronous, synchronous, overlapped; each keeps its faster run.
--compare-json-schema runs every request under a JSON schema (constrained decoding, no
overlap while constrained) against the same workload unconstrained, in the same A B B A order,
and reports the ratio of their step times (same number of steps: ignore_eos, fixed length).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from bench.common import RESULTS_DIR, ModelShape, environment, matmul_peak_gflops, write_json
from bench.offline_grammar import bench_grammar
from bench.random_model import SHAPES as RANDOM_SHAPES
from bench.random_model import write_random_model_dir
from bench.references import VLLM_HELP, run_hf, run_vllm


def make_workload(n: int, min_len: int, max_len: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    # Stay clear of the special tokens at the start of the vocabulary.
    return [
        [rng.randrange(100, vocab) for _ in range(rng.randint(min_len, max_len))] for _ in range(n)
    ]


def run_engine(
    model_dir: Path,
    prompts: list[list[int]],
    new_tokens: int,
    dtype: str,
    device: str,
    budget: int,
    grammar: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from models.sampling_params import SamplingParams

    max_len = max(len(p) for p in prompts) + new_tokens
    blocks = len(prompts) * (-(-max_len // 16)) + 16
    engine = LLMEngine(
        EngineConfig(
            model_dir=model_dir,
            dtype=dtype,
            device=device,
            num_kv_blocks=blocks,
            max_num_seqs=len(prompts),
            max_num_batched_tokens=budget,
            **options,
        )
    )
    params = SamplingParams(
        max_tokens=new_tokens, temperature=0.0, ignore_eos=True, grammar=grammar
    )
    from bench.attention_layers import AttentionLayerTimer
    from bench.moe_layers import MoeLayerTimer

    moe = MoeLayerTimer.attach(engine.runner.model)
    attn = AttentionLayerTimer.attach(engine.runner.model)
    for i, p in enumerate(prompts):
        engine.add_request(f"bench-{i}", p, params)
    bar = tqdm(
        total=len(prompts) * new_tokens, desc="engine", unit="tok", file=sys.stderr, mininterval=2.0
    )
    start = time.perf_counter()
    generated = 0
    step_s = []
    while engine.has_unfinished():
        t0 = time.perf_counter()
        before = engine.counters.generated_tokens
        engine.step_result()
        n = engine.counters.generated_tokens - before
        step_s.append(time.perf_counter() - t0)
        generated += n
        bar.update(n)
    elapsed = time.perf_counter() - start
    bar.close()
    stages = engine.ranks.stage_times() if engine.ranks is not None else []
    engine.close()  # its tensor-parallel ranks, its KV tiers
    c = engine.counters
    for timer in (moe, attn):
        if timer is not None:
            timer.detach()
    return {
        **(moe.summary(elapsed) if moe is not None else {}),
        **(attn.summary(elapsed) if attn is not None else {}),
        "seconds": elapsed,
        "generated_tokens": generated,
        "steps": c.steps,
        "step_ms": 1e3 * elapsed / max(c.steps, 1),
        # the median step: the decode steps of the whole batch (prefill is one or two steps)
        "median_step_ms": 1e3 * statistics.median(step_s) if step_s else 0.0,
        "grammar_mask_ms_per_step": 1e3 * c.grammar_mask_seconds / max(c.grammar_mask_steps, 1),
        **(
            {"pipeline_stages": [asdict(t) | {"bubble": t.bubble} for t in stages]}
            if stages
            else {}
        ),
    }


def _faster(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The faster of two runs of the same engine, with both times kept."""
    best = min(a, b, key=lambda r: r["seconds"])
    return {**best, "seconds_runs": [a["seconds"], b["seconds"]]}


def summarize(
    name: str,
    run: dict[str, Any],
    prompts: list[list[int]],
    new_tokens: int,
    shape: ModelShape,
    peak: float,
) -> dict[str, Any]:
    secs = run["seconds"]
    flops = sum(shape.sequence_flops(len(p), new_tokens) for p in prompts)
    prompt_tokens = sum(len(p) for p in prompts)
    gflops = flops / secs / 1e9
    row = {
        **run,
        "output_tok_s": run["generated_tokens"] / secs,
        "total_tok_s": (prompt_tokens + run["generated_tokens"]) / secs,
        "model_gflop": flops / 1e9,
        "achieved_gflop_s": gflops,
        "ratio_to_matmul_peak": gflops / peak,
    }
    print(
        f"{name:>13}: {secs:7.2f} s  output {row['output_tok_s']:8.1f} tok/s  total "
        f"{row['total_tok_s']:8.1f} tok/s  {gflops:7.1f} GFLOP/s  "
        f"ratio to peak {row['ratio_to_matmul_peak']:.3f}"
    )
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--min-len", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--budget", type=int, default=2048, help="max tokens per engine step")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    ap.add_argument("--compare-hf", action="store_true")
    ap.add_argument("--compare-vllm", metavar="PYTHON", help=VLLM_HELP)
    ap.add_argument("--compare-sync", action="store_true", help="also without overlap (A/B)")
    ap.add_argument(
        "--compare-json-schema", action="store_true", help="also with every request under a schema"
    )
    ap.add_argument("--random-model", choices=sorted(RANDOM_SHAPES), help="random weights")
    ap.add_argument("--decode-steps", type=int, default=32, help="CUDA: decode steps timed")
    ap.add_argument(
        "--float32-matmul-precision", choices=["highest", "medium"], default="highest",
        help="the engine's (medium: bf16 products on AMX tiles where the build has them)",
    )  # fmt: skip
    ap.add_argument(
        "--int8-activations", action="store_true",
        help="the engine's int8_activations (packed weights' products on integer dots)",
    )  # fmt: skip
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "offline.json")
    ap.add_argument(
        "--speculative-method", choices=["ngram", "draft"], default=None,
        help="compare speculative decoding with plain decoding (bench.speculative)",
    )  # fmt: skip
    ap.add_argument("--num-speculative-tokens", type=int, default=4)
    ap.add_argument("--draft-model", default=None, help="draft: the draft model directory")
    ap.add_argument("--batch-sizes", default="1,8", help="speculative: batch sizes, e.g. 1,4,8")
    ap.add_argument("--rounds", type=int, default=3, help="speculative: requests per slot")
    ap.add_argument("--tensor-parallel-size", type=int, default=1, help="N ranks x 1 thread vs N")
    ap.add_argument("--pipeline-parallel-size", type=int, default=1, help="stages; as above")
    args = ap.parse_args(argv)

    from models import ensure_model

    if args.threads:
        torch.set_num_threads(args.threads)

    tmp = tempfile.TemporaryDirectory()
    options: dict[str, Any] = {
        "float32_matmul_precision": args.float32_matmul_precision,
        "int8_activations": args.int8_activations,
    }
    if args.random_model:
        default_dir = ensure_model("smollm2")  # the tokenizer
        model_dir = write_random_model_dir(args.random_model, Path(tmp.name), default_dir)
        options["load_format"] = "random"
        args.model = f"random:{args.random_model}"
    else:
        model_dir = ensure_model(args.model)
    shape = ModelShape.from_dir(model_dir)
    if args.speculative_method:
        from bench.speculative import speculative_main

        report = speculative_main(args, model_dir, shape.vocab, options)
        path = args.out if args.out != RESULTS_DIR / "offline.json" else None
        path = path or RESULTS_DIR / "offline_speculative.json"
        write_json(path, {"benchmark": "offline_speculative", "model": args.model, **report})
        print(f"wrote {path}")
        return 0
    prompts = make_workload(args.requests, args.min_len, args.max_len, shape.vocab, args.seed)
    peak_dtype = torch.float32 if args.dtype in ("float32", "fp32") else torch.bfloat16
    # The peak is sampled before and after the runs and the best kept: a peak taken while
    # something else loads the machine would flatter the ratio.
    peaks = [matmul_peak_gflops(peak_dtype, device=args.device)]
    engine_args = (model_dir, prompts, args.new_tokens, args.dtype, args.device, args.budget)
    if args.compare_sync:  # A B B A: drift and the cost of going first fall on both
        order = [True, False, False, True]
        timed = [run_engine(*engine_args, **options, async_scheduling=o) for o in order]
        runs = {
            "splitserve": _faster(timed[0], timed[3]),
            "synchronous": _faster(timed[1], timed[2]),
        }
    elif args.compare_json_schema:  # A B B A, as above
        grammar = bench_grammar()
        grammars: list[str | None] = [None, grammar, grammar, None]
        timed = [run_engine(*engine_args, grammar=g, **options) for g in grammars]
        runs = {
            "splitserve": _faster(timed[0], timed[3]),
            "json_schema": _faster(timed[1], timed[2]),
        }
    elif args.tensor_parallel_size * args.pipeline_parallel_size > 1:  # bench.tensor_parallel
        from bench.tensor_parallel import parallel_main

        runs = parallel_main(args, model_dir, prompts, run_engine, options)
    else:
        runs = {"splitserve": run_engine(*engine_args, **options)}
    if args.compare_hf:
        runs["transformers"] = run_hf(model_dir, prompts, args.new_tokens, args.dtype)
    if args.compare_vllm:
        runs["vllm"] = run_vllm(args.compare_vllm, model_dir, prompts, args.new_tokens, args.dtype)
    peaks.append(matmul_peak_gflops(peak_dtype, device=args.device))
    peak = max(peaks)
    print(
        f"matmul peak ({peak_dtype}, {torch.get_num_threads()} threads): {peak:.1f} GFLOP/s "
        f"(before {peaks[0]:.1f}, after {peaks[1]:.1f})"
    )
    results = {
        name: summarize(name, run, prompts, args.new_tokens, shape, peak)
        for name, run in runs.items()
    }
    if "moe_seconds" in runs.get("splitserve", {}):
        from bench.moe_layers import describe as describe_moe

        print(describe_moe(runs["splitserve"], peak))
        results["splitserve"]["moe_ratio_to_peak"] = runs["splitserve"]["moe_gflop_s"] / peak
    if "attention_seconds" in runs.get("splitserve", {}):
        from bench.attention_layers import describe as describe_attention

        print(describe_attention(runs["splitserve"], peak))
        rate = runs["splitserve"]["attention_gflop_s"]
        results["splitserve"]["attention_ratio_to_peak"] = rate / peak
    for ref in ("transformers", "vllm"):
        if ref in results:
            ratio = results[ref]["seconds"] / results["splitserve"]["seconds"]
            results["splitserve"][f"speedup_over_{ref}"] = ratio
            print(f"engine speed-up over {ref} (same run): {ratio:.2f}x")
    if args.compare_sync:
        ratio = results["synchronous"]["seconds"] / results["splitserve"]["seconds"]
        print(f"overlapped over synchronous scheduling (same run): {ratio:.3f}x")
    if args.compare_json_schema:
        plain, schema = results["splitserve"], results["json_schema"]
        ratio = schema["median_step_ms"] / plain["median_step_ms"]
        results["json_schema"]["step_time_ratio_to_unconstrained"] = ratio
        print(
            f"median step under a JSON schema: {schema['median_step_ms']:.2f} ms against "
            f"{plain['median_step_ms']:.2f} ms unconstrained (same run): {ratio:.3f}x; mask "
            f"{schema['grammar_mask_ms_per_step']:.2f} ms per step, computed during the forward"
        )
    decode_step = None
    if args.device.startswith("cuda"):
        from bench.decode_step import describe, measure_decode_step

        decode_step = measure_decode_step(
            model_dir, prompts, args.dtype, args.device, args.budget, args.decode_steps, peak,
            options,
        )  # fmt: skip
        print(describe(decode_step))
    write_json(
        args.out,
        {
            "benchmark": "offline",
            "workload": {
                k: getattr(args, k)
                for k in ("requests", "min_len", "max_len", "new_tokens", "dtype", "device", "seed")
            },
            "model": args.model,
            "matmul_peak_gflop_s": peak,
            "matmul_peak_samples_gflop_s": peaks,
            "environment": environment(),
            "results": results,
            "decode_step": decode_step,
        },
    )
    print(f"wrote {args.out}")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
