"""The flags of `splitserve up` (cluster.launcher) and their checks."""

from __future__ import annotations

import argparse

from cluster.auth import ApiKey
from cluster.settings import RouterSettings, load
from models.cli import add_model_cache_flag

API_KEY_ENV = "SPLITSERVE_API_KEY"
# the router's key flags `up` hands on (names and paths: no key travels on a command line)
KEY_FLAGS = (
    ("--api-key-file", "accepted API keys, one per line: `name:key` (or a bare key)"),
    ("--usage-admin-keys", "key names that may read GET /v1/usage (comma-separated)"),
    ("--key-limits", "requests and tokens per minute by key name: `alice:rpm=60;*:rpm=600`"),
)
# OpenTelemetry flags `up` hands on to the router and every node (cluster.tracing)
TRACE_FLAGS = (
    (
        "--otlp-traces-endpoint",
        str,
        "send traces over OTLP to this collector URL (Jaeger, "
        "Tempo): `http://host:4318`; default: OTEL_EXPORTER_OTLP_ENDPOINT, else no tracing",
    ),
    ("--trace-sample-ratio", float, "share of requests traced (default 1.0)"),
)
# --tp / --pp and vLLM's names for them (same meaning: ranks / stages of one engine)
VLLM_PARALLEL = (
    ("tp", "tensor-parallel ranks", "--tensor-parallel-size"),
    ("pp", "pipeline stages", "--pipeline-parallel-size"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2", help="registry name or HF model dir")
    add_model_cache_flag(parser)
    parser.add_argument(
        "--served-model-name", default=None,
        help="the model name clients send (default: the model's name)",
    )  # fmt: skip
    parser.add_argument(
        "--max-model-len", type=int, default=None,
        help="context length of the router and every node (default: the model's)",
    )  # fmt: skip
    parser.add_argument(
        "--api-key", default=None,
        help="the router requires `Authorization: Bearer KEY` on /v1 (several: comma-separated);"
        f" prefer {API_KEY_ENV}, which other users cannot see in the process list",
    )  # fmt: skip
    add_key_arguments(parser)
    for flag, kind, help_text in TRACE_FLAGS:
        parser.add_argument(flag, type=kind, default=None, help=help_text)
    parser.add_argument("--prefill", type=int, default=1, help="prefill nodes (default 1)")
    parser.add_argument("--decode", type=int, default=1, help="decode nodes (default 1)")
    parser.add_argument(
        "--colocated", action="store_true",
        help="run --decode colocated nodes (prefill and decode in one) and no prefill pool",
    )  # fmt: skip
    parser.add_argument("--redis", default=None, help="use this Redis URL, not an embedded one")
    parser.add_argument("--host", default="127.0.0.1", help="router address (default 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=int,
        default=8000,
        help="router port (default 8000; 0: any free port, printed when up)",
    )
    parser.add_argument("--transfer", choices=["auto", "nixl", "tcp"], default="auto")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None)
    parser.add_argument("--dtype", choices=["auto", "float32", "float16", "bfloat16"])
    parser.add_argument(
        "--quantization", choices=["auto", "none", "gguf", "awq", "gptq", "fp8"], default=None,
        help="weights kept quantized, on every node (default auto: what the checkpoint "
        "declares, or the GGUF on CPU float32 nodes)",
    )  # fmt: skip
    parser.add_argument(
        "--float32-matmul-precision", choices=["highest", "medium"], default=None,
        help="every node: highest (default) or medium (on AMX CPUs, packed layers' products "
        "over many rows in bf16 inputs summed in fp32: prefill about 2x faster)",
    )  # fmt: skip
    parser.add_argument("--threads-per-node", type=int, default=None, help="torch threads")
    for short, what, vllm in VLLM_PARALLEL:
        parser.add_argument(
            f"--{short}", vllm, dest=short, type=int, default=None, metavar="N",
            help=f"{what} per node, one process per rank (both pools, or colocated); "
            f"{vllm} is vLLM's name for it",
        )  # fmt: skip
        for pool in ("prefill", "decode"):
            parser.add_argument(
                f"--{pool}-{short}", type=int, default=None,
                help=f"{what} per {pool} node (default --{short}, else 1)",
            )  # fmt: skip
    parser.add_argument("--num-kv-blocks", type=int, default=None, help="KV blocks per node")
    kv_dtypes = ["auto", "int8", "fp8_e4m3"]
    parser.add_argument(
        "--kv-cache-dtype", choices=kv_dtypes, default=None,
        help="KV cache dtype of every node: auto (the model dtype), int8 or fp8_e4m3",
    )  # fmt: skip
    for pool in ("prefill", "decode"):
        parser.add_argument(
            f"--{pool}-kv-cache-dtype", choices=kv_dtypes, default=None,
            help=f"KV cache dtype of the {pool} pool's nodes (default --kv-cache-dtype); a "
            "decode node converts KV of another dtype on import",
        )  # fmt: skip
    parser.add_argument("--max-num-seqs", type=int, default=None, help="batch size per node")
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=None,
        help="tokens one engine step computes at most, per node",
    )  # fmt: skip
    parser.add_argument(
        "--kv-offload-cpu-gb", type=float, default=None,
        help="GiB of host memory per node for a KV tier below the device",
    )  # fmt: skip
    parser.add_argument(
        "--kv-offload-disk-path", default=None,
        help="directory for the nodes' KV block files (each node its own subdirectory)",
    )  # fmt: skip
    parser.add_argument("--kv-offload-disk-gb", type=float, default=None, help="GiB per node")
    parser.add_argument(
        "--gpu-memory-utilization", type=float, default=0.9,
        help="CUDA: share of the GPU for all nodes together; each node gets an equal part",
    )  # fmt: skip
    parser.add_argument(
        "--speculative-method", choices=["none", "ngram", "draft"], default=None,
        help="speculative decoding on the decode / colocated nodes",
    )  # fmt: skip
    parser.add_argument("--num-speculative-tokens", type=int, default=None)
    parser.add_argument("--draft-model", default=None, help="draft model (registry name or dir)")
    parser.add_argument(
        "--enable-lora", action="store_true", help="serve LoRA adapters on both pools"
    )
    parser.add_argument(
        "--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
        help="LoRA adapters (PEFT directories) loaded by every node and named by requests",
    )  # fmt: skip
    parser.add_argument("--max-loras", type=int, default=None, help="adapters in one batch")
    parser.add_argument("--max-lora-rank", type=int, default=None)
    parser.add_argument("--max-cpu-loras", type=int, default=None)
    parser.add_argument(
        "--run-dir", default=None,
        help="where each process's NAME.log, cluster.json (URLs, process ids) and the header "
        "files for curl -H @FILE go: cluster-token.header (a node's /stats needs it) and "
        "api-key.header (default: a new temporary directory)",
    )  # fmt: skip
    parser.add_argument("--ready-timeout-s", type=float, default=300.0)
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    parser.add_argument(
        "--policy", choices=["kv_aware", "least_loaded", "round_robin"], default=None,
        help="the router's routing policy (default kv_aware)",
    )  # fmt: skip
    add_planner_arguments(parser)


def add_key_arguments(parser: argparse.ArgumentParser) -> None:
    """The router's API key flags beyond --api-key (cluster.settings.RouterSettings)."""
    for flag, help_text in KEY_FLAGS:
        parser.add_argument(flag, default=None, help=help_text)


def add_planner_arguments(parser: argparse.ArgumentParser) -> None:
    """--planner: a `splitserve planner` child sizes the pools; the launcher starts and
    drains nodes (between --prefill / --decode and --max-prefill / --max-decode) to follow."""
    group = parser.add_argument_group("planner")
    group.add_argument(
        "--planner", action="store_true",
        help="start the SLA planner and follow its decisions by starting and draining nodes",
    )  # fmt: skip
    group.add_argument("--ttft-slo-ms", type=float, default=1000.0, help="TTFT target (p90)")
    group.add_argument("--itl-slo-ms", type=float, default=100.0, help="ITL target (p90)")
    group.add_argument("--max-prefill", type=int, default=3, help="most prefill nodes")
    group.add_argument("--max-decode", type=int, default=3, help="most decode nodes")
    group.add_argument("--planner-interval-s", type=float, default=5.0)
    group.add_argument(
        "--planner-cooldown-s", type=float, default=30.0,
        help="after a scale-up, before the next; a scale-down waits twice as long",
    )  # fmt: skip


def check_args(args: argparse.Namespace) -> None:
    """ValueError naming the first bad flag."""
    if args.decode < 1:
        raise ValueError("--decode must be >= 1")
    if not args.colocated and args.prefill < 1:
        raise ValueError("--prefill must be >= 1 (or use --colocated)")
    for flag in ("max_model_len", "threads_per_node", "max_num_batched_tokens"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    for short in ("tp", "pp"):
        for flag in (short, f"prefill_{short}", f"decode_{short}"):
            value = getattr(args, flag, None)
            if value is not None and value < 1:
                raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
        pools = (getattr(args, f"prefill_{short}", None), getattr(args, f"decode_{short}", None))
        if args.colocated and any(pools):
            raise ValueError(
                f"--prefill-{short} / --decode-{short} size the two pools: "
                f"use --{short} with --colocated"
            )
    ratio = getattr(args, "trace_sample_ratio", None)
    if ratio is not None and not 0 <= ratio <= 1:
        raise ValueError(f"--trace-sample-ratio must be in [0, 1], got {ratio}")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535] (0: any free port), got {args.port}")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise ValueError("--gpu-memory-utilization must be in (0, 1]")
    k = args.num_speculative_tokens
    if k is not None and not 1 <= k <= 16:
        raise ValueError(f"--num-speculative-tokens must be in [1, 16], got {k}")
    if args.speculative_method == "draft" and not args.draft_model:
        raise ValueError("--speculative-method draft needs --draft-model")
    if args.draft_model and args.speculative_method != "draft":
        raise ValueError("--draft-model needs --speculative-method draft")
    if args.planner:
        if args.colocated:
            raise ValueError("--planner sizes a prefill and a decode pool: not with --colocated")
        if args.max_prefill < args.prefill or args.max_decode < args.decode:
            raise ValueError("--max-prefill / --max-decode must be >= --prefill / --decode")


def check_keys(args: argparse.Namespace) -> tuple[ApiKey, ...]:
    """The router's API keys as it will read them (the flags, else its SPLITSERVE_* variables),
    checked before anything starts with the key names of --usage-admin-keys and --key-limits.
    SettingsError (a ValueError) names the bad field; never a key."""
    settings = load(
        RouterSettings, api_key=args.api_key, api_key_file=args.api_key_file,
        usage_admin_keys=args.usage_admin_keys, key_limits=args.key_limits,
    )  # fmt: skip
    return settings.api_keys()
