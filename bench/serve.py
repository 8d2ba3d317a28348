"""Serving benchmark: Poisson load against any OpenAI-compatible server, streamed.

    splitserve bench serve --url http://127.0.0.1:8000 --workload chat --rates 0.5,1,2
    splitserve bench serve --compare disagg.json colocated.json --plot-dir plots/
    python -m bench.serve ...  (the same)

Each sweep point sends --num-requests seeded requests (or as many as arrive in --duration s)
with Poisson arrivals at the offered rate (`inf`: all at once) to POST /v1/completions with a
token-id prompt, `max_tokens` = the sampled output length, `ignore_eos`, temperature 0 and
streaming. Per request it records TTFT, TPOT (DistServe: (last token - first token) /
(output tokens - 1)), inter-token latencies and E2E; per point it prints p50/p90/p99, request
and output-token throughput and goodput (req/s within --slo-ttft-ms and --slo-tpot-ms), and
the JSON holds every request's record (see bench/serve_client.py, bench/serve_stats.py).

`--workload multiturn` (bench/multiturn.py) sends conversations instead: --users of them,
started at the offered rate (conversations per second), each --turns turns that grow on a
shared system prompt; it also prints the prompt tokens the server computed (not cached).

Sizing: a point lasts about num_requests / rate seconds plus the tail of the last requests,
as long as the server keeps up (rate x mean output length below its decode throughput, which
bench/offline.py measures). The full workloads (bench/workloads.py) suit a GPU. On a 2-core
CPU box with the 135M default model shrink them, e.g. `--max-prompt 256 --max-output 32
--rates 0.25,0.5,1`, and keep the default 32 requests so a point stays within one to two
minutes; check the printed achieved / offered rate: well below 1 means the rate is past
what the server can serve and the point only measures queueing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.multiturn import (
    Multiturn,
    format_lengths,
    parse_lengths,
    prefix_summary,
    run_conversations,
)
from bench.schedule import Phase, parse_schedule, phase_records, schedule_arrivals
from bench.serve_client import (
    LoadOptions,
    Target,
    Unreachable,
    discover_model,
    normalize_base_url,
    run_point,
)
from bench.serve_stats import SLO, point_report, resummarize, summarize, sweep_table
from bench.workloads import WORKLOADS, arrivals_within, get_workload, poisson_arrivals

DEFAULT_SLO = SLO(ttft_ms=1000.0, tpot_ms=100.0)
MULTITURN = "multiturn"
SMOLLM2_VOCAB = 49152


@dataclass(frozen=True)
class ServeConfig:
    """One benchmark run (the api key is deliberately not part of it: it is never written)."""

    url: str
    model: str | None
    workload: str
    rates: tuple[float | None, ...]  # None: all requests at once
    num_requests: int
    duration_s: float | None
    max_prompt: int | None
    max_output: int | None
    vocab_size: int
    seed: int
    slo: SLO
    load: LoadOptions
    warmup: int
    label: str | None
    multiturn: Multiturn | None = None  # the shape of --workload multiturn
    schedule: tuple[Phase, ...] | None = None  # --rate-schedule: one run of changing rate

    def __post_init__(self) -> None:
        if self.workload != MULTITURN:
            get_workload(self.workload)
        elif self.multiturn is None:
            raise ValueError("the multiturn workload needs its shape (Multiturn)")
        if not self.rates:
            raise ValueError("rates must not be empty")
        if self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")
        if self.duration_s is not None and (self.duration_s <= 0 or None in self.rates):
            raise ValueError("duration_s must be > 0 and needs finite rates")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if self.schedule is not None and self.multiturn is not None:
            raise ValueError("--rate-schedule sends single requests: not with multiturn")

    def to_json(self, model: str) -> dict[str, Any]:
        return {**asdict(self), "model": model, "rates": list(self.rates)}


def parse_rate(text: str) -> float | None:
    """A rate in req/s; `inf` (all at once) is None."""
    if text.strip().lower() == "inf":
        return None
    rate = float(text)
    if not rate > 0:
        raise argparse.ArgumentTypeError(f"rate must be > 0 or inf, got {text}")
    return rate


def parse_rates(text: str) -> tuple[float | None, ...]:
    return tuple(parse_rate(part) for part in text.split(",") if part.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--url", default="http://127.0.0.1:8000", help="server base URL (with or without /v1)")
    a("--model", help="model name to send (default: the first one /v1/models lists)")
    a("--api-key", default=os.environ.get("SPLITSERVE_API_KEY") or os.environ.get("OPENAI_API_KEY"))
    a("--workload", choices=[*sorted(WORKLOADS), MULTITURN], default="chat")
    rate = parser.add_mutually_exclusive_group()
    rate.add_argument("--rate", type=parse_rate, default=1.0, help="req/s, or inf (default 1)")
    rate.add_argument("--rates", type=parse_rates, help="a sweep, e.g. 0.5,1,2,4")
    rate.add_argument(
        "--rate-schedule", type=parse_schedule,
        help="one run whose rate changes: RATE:SECONDS,... e.g. 0.5:30,2:60,0.5:60",
    )  # fmt: skip
    a("--num-requests", type=int, default=32, help="requests per sweep point")
    a("--duration", type=float, help="instead of --num-requests: seconds of arrivals per point")
    a("--max-prompt", type=int, help="scale prompt lengths down to at most this many tokens")
    a("--max-output", type=int, help="scale output lengths down to at most this many tokens")
    a("--vocab-size", type=int, default=SMOLLM2_VOCAB, help="prompt token ids are drawn below")
    a("--seed", type=int, default=0)
    a("--slo-ttft-ms", type=float, help=f"TTFT SLO for goodput (default {DEFAULT_SLO.ttft_ms:g})")
    a("--slo-tpot-ms", type=float, help=f"TPOT SLO for goodput (default {DEFAULT_SLO.tpot_ms:g})")
    a("--max-concurrency", type=int, help="cap on requests in flight (default: none)")
    shape = Multiturn()
    a("--users", type=int, default=shape.users, help="multiturn: conversations per point")
    a("--turns", type=int, default=shape.turns, help="multiturn: turns per conversation")
    a("--system-tokens", type=int, default=shape.system, help="multiturn: shared system prompt")
    a("--think-time", type=float, default=shape.think_s, help="multiturn: mean pause, s")
    a(
        "--question-tokens",
        type=parse_lengths,
        default=shape.question,
        help=f"multiturn: LOW:HIGH[:lognormal] (default {format_lengths(shape.question)})",
    )
    a(
        "--answer-tokens",
        type=parse_lengths,
        default=shape.answer,
        help=f"multiturn: LOW:HIGH[:lognormal] (default {format_lengths(shape.answer)})",
    )
    a("--timeout", type=float, default=300.0, help="per-request timeout in seconds")
    a("--warmup", type=int, default=1, help="untimed requests sent before the sweep")
    a("--label", help="name of this run in --compare tables and plots")
    a("--out", type=Path, help="JSON output (default bench/results/serve.json)")
    a("--plot-dir", type=Path, help="write PNG plots (latency CDFs, goodput vs rate) here")
    a("--compare", nargs=2, type=Path, metavar=("A.json", "B.json"), help="compare two runs")
    a("--no-progress", action="store_true", help="no progress bar")


def _slo(args: argparse.Namespace, fallback: SLO) -> SLO:
    return SLO(
        ttft_ms=args.slo_ttft_ms if args.slo_ttft_ms is not None else fallback.ttft_ms,
        tpot_ms=args.slo_tpot_ms if args.slo_tpot_ms is not None else fallback.tpot_ms,
    )


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    rates = args.rates or (args.rate,)
    return ServeConfig(
        url=normalize_base_url(args.url), model=args.model, workload=args.workload,
        rates=rates, num_requests=args.num_requests, duration_s=args.duration,
        max_prompt=args.max_prompt, max_output=args.max_output, vocab_size=args.vocab_size,
        seed=args.seed, slo=_slo(args, DEFAULT_SLO),
        load=LoadOptions(args.timeout, args.max_concurrency, progress=not args.no_progress),
        warmup=args.warmup, label=args.label, multiturn=_multiturn(args),
        schedule=args.rate_schedule,
    )  # fmt: skip


def _multiturn(args: argparse.Namespace) -> Multiturn | None:
    if args.workload != MULTITURN:
        return None
    return Multiturn(
        users=args.users, turns=args.turns, system=args.system_tokens,
        question=args.question_tokens, answer=args.answer_tokens, think_s=args.think_time,
    )  # fmt: skip


async def _warm_up(target: Target, config: ServeConfig, opts: LoadOptions) -> None:
    name = "chat" if config.workload == MULTITURN else config.workload
    workload = get_workload(name).capped(config.max_prompt, config.max_output)
    specs = workload.sample(config.warmup, config.seed + 1, config.vocab_size)
    run = await run_point(target, specs, [0.0] * len(specs), opts, "warmup")
    errors = [r.error for r in run.records if r.error]
    if len(errors) == len(specs):
        raise Unreachable(f"every warmup request failed: {errors[0]}")


async def _scheduled(target: Target, config: ServeConfig) -> dict[str, Any]:
    """One run over the rate schedule, summarized per phase."""
    assert config.schedule is not None
    workload = get_workload(config.workload).capped(config.max_prompt, config.max_output)
    arrivals = schedule_arrivals(config.schedule, config.seed)
    specs = workload.sample(len(arrivals), config.seed, config.vocab_size)
    run = await run_point(target, specs, [t for t, _ in arrivals], config.load, "schedule")
    records = [r.to_dict() for r in run.records]
    phases = []
    for phase, mine in phase_records(records, arrivals, config.schedule):
        summary = summarize(mine, phase.seconds, phase.rate, config.slo)
        print(point_report(summary), flush=True)
        phases.append({"rate": phase.rate, "seconds": phase.seconds, "summary": summary})
    whole = summarize(records, run.duration_s, None, config.slo)
    return {"rate": None, "duration_s": run.duration_s, "summary": whole, "phases": phases,
            "records": records}  # fmt: skip


async def _point(target: Target, config: ServeConfig, rate: float | None) -> dict[str, Any]:
    if config.schedule is not None:
        return await _scheduled(target, config)
    if config.multiturn is not None:
        return await _multiturn_point(target, config, config.multiturn, rate)
    workload = get_workload(config.workload).capped(config.max_prompt, config.max_output)
    n = config.num_requests
    if config.duration_s is not None and rate is not None:
        n = arrivals_within(config.duration_s, rate, config.seed)
    specs = workload.sample(n, config.seed, config.vocab_size)
    arrivals = poisson_arrivals(n, rate, config.seed)
    desc = f"rate {'inf' if rate is None else f'{rate:g}'}"
    run = await run_point(target, specs, arrivals, config.load, desc)
    records = [r.to_dict() for r in run.records]
    summary = summarize(records, run.duration_s, rate, config.slo)
    print(point_report(summary), flush=True)
    return {"rate": rate, "duration_s": run.duration_s, "summary": summary, "records": records}


async def _multiturn_point(
    target: Target, config: ServeConfig, shape: Multiturn, rate: float | None
) -> dict[str, Any]:
    desc = f"multiturn rate {'inf' if rate is None else f'{rate:g}'}"
    run = await run_conversations(
        target, shape, config.seed, config.vocab_size, rate, config.load, desc
    )
    records = [r.to_dict() for r in run.records]
    summary = summarize(records, run.duration_s, None, config.slo)  # no offered request rate
    summary["conversation_rate"] = rate
    summary["prefix"] = prefix_summary(records)
    head = f"multiturn: {shape.users} conversations of {shape.turns} turns, {desc[10:]}/s"
    print(head + "\n" + point_report(summary).split("\n", 1)[1], flush=True)
    prefix = summary["prefix"]
    print(
        f"  prompt tokens {prefix['prompt_tokens']}, from caches {prefix['cached_tokens']} "
        f"({prefix['cached_ratio']:.0%}), computed {prefix['computed_prompt_tokens']}",
        flush=True,
    )
    return {"rate": rate, "duration_s": run.duration_s, "summary": summary, "records": records}


async def run_sweep(config: ServeConfig, api_key: str | None) -> dict[str, Any]:
    """Every sweep point of `config`; raises Unreachable when the server does not answer."""
    from bench.common import environment

    target = await discover_model(config.url, config.model, api_key)
    if config.warmup:
        await _warm_up(target, config, LoadOptions(config.load.timeout_s, progress=False))
    points = [await _point(target, config, rate) for rate in config.rates]
    env = {**environment(), "python": platform.python_version(), "host": platform.node()}
    return {"bench": "serve", "config": config.to_json(target.model), "environment": env,
            "points": points}  # fmt: skip


def _compare(args: argparse.Namespace) -> int:
    from bench.plots import load_results
    from bench.serve_stats import compare_table

    loaded = load_results(list(args.compare))
    first = next(iter(loaded.values()))
    slo = _slo(args, SLO(**first["config"]["slo"]))
    results = {label: resummarize(r, slo) for label, r in loaded.items()}
    (name_a, a), (name_b, b) = results.items()
    print(compare_table(a, b, (name_a, name_b)))
    _plot(results, args.plot_dir)
    return 0


def _plot(results: dict[str, dict[str, Any]], plot_dir: Path | None) -> None:
    if plot_dir is None:
        return
    from bench.plots import plot_all

    for png in plot_all(results, plot_dir):
        print(f"wrote {png}")


def run(args: argparse.Namespace) -> int:
    if args.compare:
        return _compare(args)
    try:
        config = config_from_args(args)
        result = asyncio.run(run_sweep(config, args.api_key))
    except (ValueError, Unreachable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from bench.common import RESULTS_DIR, write_json

    print(sweep_table(result))
    out = write_json(args.out or RESULTS_DIR / "serve.json", result)
    print(f"wrote {out}")
    _plot({args.label or out.stem: result}, args.plot_dir)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="splitserve bench serve", description=__doc__, allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
