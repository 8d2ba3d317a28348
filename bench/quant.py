"""Decode speed of a model served from its packed GGUF against its fp32 conversion.

For each quantization (``none``: the fp32 safetensors; ``gguf``: the directory's GGUF, packed)
an engine decodes batches of random prompts; the median step of ``--steps`` all-decode steps
gives output tokens per second. Batch-1 decode reads every weight once a step, so each figure
is set against the same-run limit of reading the weights at copy speed (the weight bytes over
2x the memcpy bandwidth, as bench.decode_step counts copy traffic). When ``llama_cpp``
(llama-cpp-python, the optional ``bench-llamacpp`` extra) imports, the same GGUF is timed
through it at batch 1 in a child process (bench.llama_cpp_decode), same prompt token ids,
same threads, same number of timed decode steps; the JSON gives ours / llama.cpp and which
mode llama.cpp ran in (``no_extra_bufts`` when its default mode crashed).

    python -m bench.quant [--model smollm2] [--batches 1 32] [--steps 16]
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path
from typing import Any

import torch

from bench import llama_cpp_decode
from bench.common import RESULTS_DIR, environment, memcpy_gbps, write_json
from bench.decode_step import time_decode_steps
from engine.config import engine_config
from engine.engine import LLMEngine
from engine.model.quant import gguf_file

COPY_BYTES = 256 << 20


def prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab, (batch, length), generator=gen).tolist()


def bench_engine(model_dir: Path, quantization: str, args: argparse.Namespace) -> dict[str, Any]:
    """tok/s of each batch size with this quantization, and the weight bytes read a step."""
    engine = LLMEngine(
        engine_config(
            model_dir, device="cpu", quantization=quantization, max_num_seqs=max(args.batches),
            max_num_batched_tokens=2048, num_kv_blocks=args.kv_blocks,
        )
    )  # fmt: skip
    weight_bytes = engine.runner.model.weight_bytes()[0]
    vocab = args.vocab = engine.runner.model_config.vocab_size
    row: dict[str, Any] = {"weight_bytes": weight_bytes}
    for batch in args.batches:
        timing = time_decode_steps(
            engine, prompts(batch, args.prompt_len, vocab, batch), args.steps
        )
        row[f"batch_{batch}"] = {
            "median_step_ms": timing.median_step_s * 1e3,
            "tok_s": batch / timing.median_step_s,
            # reading every weight once a step at copy speed
            "ratio_to_weight_roofline": (weight_bytes / args.traffic) / timing.median_step_s,
        }
    del engine
    gc.collect()
    return row


def bench_llama_cpp(gguf: Path, args: argparse.Namespace) -> dict[str, Any] | None:
    """Batch-1 greedy decode tok/s of llama.cpp on the same GGUF, prompt (token ids), threads
    and timed decode steps as ours, in a child process (bench.llama_cpp_decode: a crash of
    llama.cpp's repacked kernels is retried with them off); None without llama_cpp."""
    if not llama_cpp_decode.importable():
        return None
    threads = torch.get_num_threads()
    prompt = prompts(1, args.prompt_len, args.vocab, 1)[0]  # bench_engine's batch-1 prompt
    return {"batch_1": llama_cpp_decode.run(gguf, prompt, threads, args.steps)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--model", default="smollm2", help="registry name or directory with a GGUF")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--steps", type=int, default=16, help="timed decode steps per batch")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--kv-blocks", type=int, default=512)
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "quant.json")
    args = ap.parse_args(argv)
    if min(args.batches) < 1 or args.steps < 1 or args.prompt_len < 1:
        ap.error("--batches, --steps and --prompt-len must be >= 1")
    from models import ensure_model

    model_dir = ensure_model(args.model)
    gguf = gguf_file(model_dir)
    if gguf is None:
        ap.error(f"{model_dir} has no GGUF file (splitserve model pull keeps it)")
    args.traffic = 2 * memcpy_gbps(COPY_BYTES) * 1e9
    print(
        f"{model_dir.name}: decode, {torch.get_num_threads()} threads, prompts of "
        f"{args.prompt_len} tokens; copy traffic {args.traffic / 1e9:.1f} GB/s"
    )
    results: dict[str, Any] = {}
    for quantization in ("none", "gguf"):
        row = results[quantization] = bench_engine(model_dir, quantization, args)
        for batch in args.batches:
            r = row[f"batch_{batch}"]
            print(
                f"  {quantization:>5} ({row['weight_bytes'] / 1e6:6.1f} MB): batch {batch:>3} "
                f"{r['tok_s']:8.1f} tok/s, step {r['median_step_ms']:7.2f} ms, ratio to "
                f"weight roofline {r['ratio_to_weight_roofline']:.2f}"
            )
    for batch in args.batches:
        speedup = (
            results["gguf"][f"batch_{batch}"]["tok_s"] / results["none"][f"batch_{batch}"]["tok_s"]
        )
        results[f"gguf_over_none_batch_{batch}"] = speedup
        print(f"  batch {batch}: packed / fp32 {speedup:.2f}x")
    llama = bench_llama_cpp(gguf, args) if 1 in args.batches else None
    if llama is not None:
        results["llama_cpp"] = llama
        ratio = results["gguf"]["batch_1"]["tok_s"] / llama["batch_1"]["tok_s"]
        results["gguf_over_llama_cpp_batch_1"] = ratio
        mode = llama["batch_1"]["mode"]
        print(
            f"  llama.cpp ({mode}) batch 1: {llama['batch_1']['tok_s']:.1f} tok/s; ours / it "
            f"{ratio:.2f}x"
        )
    elif 1 in args.batches:
        print("  llama.cpp: llama_cpp not importable (the bench-llamacpp extra), skipped")
    payload = {
        "benchmark": "quant",
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "traffic", "vocab")},
        "environment": environment(),
        "copy_traffic_gb_s": args.traffic / 1e9,
        "model": str(model_dir.name),
        "results": results,
    }
    write_json(args.out, payload)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
