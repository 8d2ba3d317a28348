"""A whole cluster to saturation: `splitserve up` under `splitserve bench serve`'s client.

    python -m bench.up_serve [--device cuda] [--random-model llama-1b] [--concurrency 16,64,256]

`splitserve up --load-format random` starts 1 prefill and 1 decode node (--prefill /
--decode) on seeded random weights of a published model's shapes (bench.random_model) with
the default model's tokenizer; the vocabulary is the tokenizer's, so that every token the
model samples streams as text. On one GPU the nodes share it: `up` gives each an equal part of
--gpu-memory-utilization. Then, for each level of --concurrency, the chat workload
(bench/workloads.py) keeps that many requests in flight (all sent at once, capped by
--max-concurrency) until --waves x that many are done. Per level: TTFT and TPOT p50 / p99
and the output tokens per second; the top level's are the saturated figures. With
--budget-s the run, start-up included, ends by then: later levels are skipped, requests time
out by it, and the cluster stops before the script returns.

A request refused for want of KV blocks fails the run (exit 1): any request the bench saw
fail, or any call a node answered busy (429 / 503: a decode node whose KV imports waited for
blocks past their deadline or filled its import queue, a prefill node past its queue), as the
router counts them (`splitserve_router_node_errors_total{kind="busy"}`). The JSON also holds
the router's pauses for a busy decode pool and each node's preemptions and KV blocks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, write_json
from bench.random_model import SHAPES, write_random_model_dir
from bench.serve import DEFAULT_SLO, ServeConfig, run_sweep
from bench.serve_client import LoadOptions
from bench.up_child import UP_TIMEOUT_S, UpChild

ROLES = ("prefill", "decode")
WORKLOAD = "chat"
MIN_LEVEL_S = 5.0  # a level is not started with less of --budget-s left


def parse_levels(text: str) -> tuple[int, ...]:
    """`16,64,256`: concurrency levels, each >= 1, rising."""
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--concurrency {text!r}: integers, e.g. 16,64,256"
        ) from None
    if not levels or min(levels) < 1 or list(levels) != sorted(set(levels)):
        raise argparse.ArgumentTypeError(f"--concurrency {text!r}: rising integers >= 1")
    return levels


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.up_serve", description=__doc__, allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    a = ap.add_argument
    a("--device", default="cuda", help="the nodes' --device (cuda, cpu)")
    a("--random-model", choices=sorted(SHAPES), default="llama-1b", help="the weights' shapes")
    a("--tokenizer-from", default="smollm2", help="model (registry name or dir) of the tokenizer")
    a("--prefill", type=positive, default=1, help="prefill nodes")
    a("--decode", type=positive, default=1, help="decode nodes")
    a("--concurrency", type=parse_levels, default=(16, 64, 256), help="levels, e.g. 16,64,256")
    a("--waves", type=positive, default=2, help="requests per level: waves x concurrency")
    a("--max-prompt", type=positive, help="scale prompt lengths down to at most this")
    a("--max-output", type=positive, help="scale output lengths down to at most this")
    a("--warmup", type=int, default=4, help="untimed requests before the first level")
    a("--timeout", type=float, default=60.0, help="per-request timeout in seconds")
    a("--budget-s", type=float, help="seconds for the whole run, start-up included")
    a("--up-args", default="", help="more `splitserve up` flags, one string")
    a("--seed", type=int, default=0)
    a("--out", type=Path, default=RESULTS_DIR / "up_serve.json")
    return ap.parse_args(argv)


def model_dir(args: argparse.Namespace, directory: Path) -> tuple[Path, int]:
    """The random model's directory (its shapes, the tokenizer's files and vocabulary) and
    that vocabulary's size."""
    from models import ensure_model

    try:
        tokenizer_dir = ensure_model(args.tokenizer_from, progress=False, weights=False)
    except Exception as exc:  # not pulled and no network, or not a model directory
        raise SystemExit(f"--tokenizer-from {args.tokenizer_from!r}: {exc}") from None
    vocab = int(json.loads((tokenizer_dir / "config.json").read_text())["vocab_size"])
    path = write_random_model_dir(args.random_model, directory, tokenizer_dir, vocab_size=vocab)
    return path, vocab


def up_args(args: argparse.Namespace, model: Path) -> list[str]:
    argv = ["--model", str(model), "--load-format", "random", "--device", args.device]
    argv += ["--prefill", str(args.prefill), "--decode", str(args.decode)]
    return [*argv, *shlex.split(args.up_args)]


def level_config(
    args: argparse.Namespace, url: str, vocab: int, concurrency: int, warmup: int, left_s: float
) -> ServeConfig:
    load = LoadOptions(min(args.timeout, left_s), concurrency, progress=False)
    return ServeConfig(
        url=url, model=None, workload=WORKLOAD, rates=(None,),
        num_requests=args.waves * concurrency, duration_s=None, max_prompt=args.max_prompt,
        max_output=args.max_output, vocab_size=vocab, seed=args.seed, slo=DEFAULT_SLO,
        load=load, warmup=warmup, label=f"concurrency {concurrency}",
    )  # fmt: skip


def run_levels(
    args: argparse.Namespace, up: UpChild, vocab: int, deadline: float
) -> list[dict[str, Any]]:
    """One sweep point per concurrency level (the warmup before the first) until
    ``deadline`` (monotonic); summaries only, a level not started marked skipped."""
    levels: list[dict[str, Any]] = []
    for n, concurrency in enumerate(args.concurrency):
        left_s = deadline - time.monotonic()
        if left_s < MIN_LEVEL_S:
            levels.append({"concurrency": concurrency, "skipped": f"{left_s:.0f} s left"})
            continue
        warmup = args.warmup if n == 0 else 0
        config = level_config(args, up.url, vocab, concurrency, warmup, left_s)
        result = asyncio.run(run_sweep(config, None))
        levels.append({"concurrency": concurrency, "summary": result["points"][0]["summary"]})
    return levels


def refusals(up: UpChild) -> dict[str, Any]:
    """From the router's /metrics: node calls answered busy, by role, and the pauses while
    every decode node was busy; from each node's /stats: preemptions and KV blocks."""
    busy = dict.fromkeys(ROLES, 0)
    decode_waits = 0
    for sample in up.router_samples():
        if sample.name == "splitserve_router_node_errors_total":
            if sample.labels["kind"] == "busy":
                role = sample.labels["node_role"]
                busy[role] = busy.get(role, 0) + int(sample.value)
        elif sample.name == "splitserve_router_decode_waits_total":
            decode_waits += int(sample.value)
    nodes = {}
    for role in ROLES:
        for name, url in up.node_urls(role).items():
            stats = up.stats(url)
            nodes[name] = {
                "preemptions": int(stats["counters"].get("preemptions", 0)),
                "total_blocks": stats["load"]["total_blocks"],
            }
    return {"busy": busy, "decode_waits": decode_waits, "nodes": nodes}


def report(
    args: argparse.Namespace, start_s: float, levels: list[dict[str, Any]], kv: dict[str, Any]
) -> dict[str, Any]:
    ran = [level for level in levels if "summary" in level]
    if not ran:
        raise SystemExit("bench.up_serve: no concurrency level ran within --budget-s")
    top = ran[-1]["summary"]
    failed = sum(level["summary"]["failed"] for level in ran)
    saturated = {
        "concurrency": ran[-1]["concurrency"],
        "output_tok_s": top["output_token_throughput"],
        **{f"{m}_p{p}_ms": top[f"{m}_ms"][f"p{p}"] for m in ("ttft", "tpot") for p in (50, 99)},
    }
    return {
        "benchmark": "up_serve", "device": args.device, "model": f"random:{args.random_model}",
        "workload": WORKLOAD, "start_s": start_s, "levels": levels, "saturated": saturated,
        "failed_requests": failed, "refused_for_kv": sum(kv["busy"].values()),
        "kv": kv, "config": json.loads(json.dumps(vars(args), default=str)),
    }  # fmt: skip


def served_all(result: dict[str, Any]) -> bool:
    """No node refused a call for want of KV blocks and every request completed."""
    return result["refused_for_kv"] == 0 and result["failed_requests"] == 0


def print_table(result: dict[str, Any]) -> None:
    print(
        f"up in {result['start_s']:.1f} s; refused for want of KV blocks: "
        f"{result['refused_for_kv']}; failed requests: {result['failed_requests']}"
    )
    print("| concurrency | ok | failed | out tok/s | TTFT p50 | p99 | TPOT p50 | p99 (ms) |")
    for level in result["levels"]:
        if "summary" not in level:
            print(f"| {level['concurrency']} | skipped: {level['skipped']} |")
            continue
        s = level["summary"]
        ttft, tpot = s["ttft_ms"], s["tpot_ms"]
        print(
            f"| {level['concurrency']} | {s['completed']} | {s['failed']} "
            f"| {s['output_token_throughput']:.0f} | {_ms(ttft['p50'])} | {_ms(ttft['p99'])} "
            f"| {_ms(tpot['p50'])} | {_ms(tpot['p99'])} |"
        )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="up-serve-") as tmp:
        model, vocab = model_dir(args, Path(tmp) / "model")
        budget_s = args.budget_s if args.budget_s is not None else UP_TIMEOUT_S + 3600
        deadline = time.monotonic() + budget_s
        up = UpChild(up_args(args, model), Path(tmp) / "run", min(UP_TIMEOUT_S, budget_s))
        try:
            levels = run_levels(args, up, vocab, deadline)
            kv = refusals(up)
        finally:
            up.stop()
    result = report(args, up.start_s, levels, kv)
    print_table(result)
    print(f"wrote {write_json(args.out, result)}")
    return 0 if served_all(result) else 1


if __name__ == "__main__":
    sys.exit(main())
