"""What `splitserve up` starts: the nodes it plans (name, role, port) and the command line
and environment of each child (cluster.launcher starts them)."""

from __future__ import annotations

import argparse
import math
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cluster.listen import bound_port, open_listener
from cluster.up_args import API_KEY_ENV, KEY_FLAGS, TRACE_FLAGS


@dataclass(frozen=True)
class NodePlan:
    name: str  # also the node id
    command: str  # "prefill" or "decode"
    role: str
    port: int
    # bound on `port` by the launcher and handed to the node's process (cluster.listen)
    listener: socket.socket | None = field(default=None, compare=False, repr=False)

    @classmethod
    def bound(cls, name: str, command: str, role: str) -> NodePlan:
        """A plan whose port is bound now (on 127.0.0.1, the kernel's pick)."""
        sock = open_listener("127.0.0.1", 0)
        return cls(name, command, role, bound_port(sock), sock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def router_environment(args: argparse.Namespace, env: dict[str, str]) -> dict[str, str]:
    """The router's environment: the children's, with the API key of --api-key."""
    return env if args.api_key is None else dict(env, **{API_KEY_ENV: args.api_key})


def plan_nodes(args: argparse.Namespace) -> list[NodePlan]:
    nodes: list[NodePlan] = []
    if args.colocated:
        for i in range(args.decode):
            nodes.append(NodePlan.bound(f"colocated-{i}", "decode", "colocated"))
        return nodes
    for i in range(args.prefill):
        nodes.append(NodePlan.bound(f"prefill-{i}", "prefill", "prefill"))
    for i in range(args.decode):
        nodes.append(NodePlan.bound(f"decode-{i}", "decode", "decode"))
    return nodes


def _cli() -> list[str]:
    return [sys.executable, "-m", "cluster.cli"]


def router_argv(args: argparse.Namespace, model: Path, redis_url: str) -> list[str]:
    argv = [*_cli(), "router", "--host", args.host, "--port", str(args.port)]
    argv += ["--redis-url", redis_url, "--model", str(model)]
    if args.log_level:
        argv += ["--log-level", args.log_level]
    if args.policy:
        argv += ["--policy", args.policy]
    if args.served_model_name:
        argv += ["--served-model-name", args.served_model_name]
    if args.max_model_len is not None:
        argv += ["--max-model-len", str(args.max_model_len)]
    for flag, _ in KEY_FLAGS:
        if (value := getattr(args, flag.removeprefix("--").replace("-", "_"), None)) is not None:
            argv += [flag, str(value)]
    if getattr(args, "lora_modules", None):
        argv += ["--lora-modules", *args.lora_modules]
    return argv + trace_argv(args)


def trace_argv(args: argparse.Namespace) -> list[str]:
    """The tracing flags the router and every node get alike."""
    argv: list[str] = []
    for flag, _, _ in TRACE_FLAGS:
        if (value := getattr(args, flag.removeprefix("--").replace("-", "_"), None)) is not None:
            argv += [flag, str(value)]
    return argv


def planner_argv(args: argparse.Namespace, redis_url: str, port: int) -> list[str]:
    """The planner of `up --planner`: reads the router and the nodes directly; the pools'
    minimum is what `up` started with."""
    argv = [*_cli(), "planner", "--port", str(port), "--redis-url", redis_url]
    argv += ["--router-url", f"http://{local_host(args.host)}:{args.port}"]
    argv += ["--ttft-slo-ms", str(args.ttft_slo_ms), "--itl-slo-ms", str(args.itl_slo_ms)]
    argv += ["--min-prefill", str(args.prefill), "--max-prefill", str(args.max_prefill)]
    argv += ["--min-decode", str(args.decode), "--max-decode", str(args.max_decode)]
    argv += ["--interval-s", str(args.planner_interval_s)]
    argv += ["--up-cooldown-s", str(args.planner_cooldown_s)]
    argv += ["--down-cooldown-s", str(2 * args.planner_cooldown_s)]
    argv += ["--start-timeout-s", str(args.ready_timeout_s)]  # as long as `up` waits for one
    if args.log_level:
        argv += ["--log-level", args.log_level]
    return argv


def local_host(host: str) -> str:
    """The address to reach a server of this machine listening on `host`."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def node_argv(args: argparse.Namespace, model: Path, redis_url: str, node: NodePlan) -> list[str]:
    argv = [*_cli(), node.command, "--host", "127.0.0.1", "--port", str(node.port)]
    argv += ["--redis-url", redis_url, "--model", str(model), "--node-id", node.name]
    argv += ["--transfer", args.transfer]
    if node.command == "decode":
        argv += ["--role", node.role]
        speculative = {
            "--speculative-method": args.speculative_method,
            "--num-speculative-tokens": args.num_speculative_tokens,
            "--draft-model": args.draft_model,
        }
        argv += [str(x) for flag, v in speculative.items() if v is not None for x in (flag, v)]
    disk = args.kv_offload_disk_path
    optional = {
        "--device": args.device,
        "--dtype": args.dtype,
        "--quantization": args.quantization,
        "--float32-matmul-precision": args.float32_matmul_precision,
        "--torch-threads": args.threads_per_node,
        "--tensor-parallel-size": node_parallel(args, node, "tp"),
        "--pipeline-parallel-size": node_parallel(args, node, "pp"),
        "--num-kv-blocks": args.num_kv_blocks,
        "--kv-cache-dtype": node_kv_cache_dtype(args, node.command),
        "--max-num-seqs": args.max_num_seqs,
        "--max-num-batched-tokens": args.max_num_batched_tokens,
        "--kv-offload-cpu-gb": args.kv_offload_cpu_gb,
        "--kv-offload-disk-gb": args.kv_offload_disk_gb,
        "--kv-offload-disk-path": Path(disk) / node.name if disk else None,  # one per node
        "--max-model-len": args.max_model_len,
        "--gpu-memory-utilization": node_gpu_share(args),
        "--log-level": args.log_level,
    }
    for flag, value in optional.items():
        if value is not None:
            argv += [flag, str(value)]
    return argv + lora_argv(args) + trace_argv(args)


def lora_argv(args: argparse.Namespace) -> list[str]:
    """The LoRA flags every node gets, both pools alike."""
    if not getattr(args, "enable_lora", False) and not getattr(args, "lora_modules", None):
        return []
    argv = ["--enable-lora"]
    for flag in ("max_loras", "max_lora_rank", "max_cpu_loras"):
        if (value := getattr(args, flag, None)) is not None:
            argv += ["--" + flag.replace("_", "-"), str(value)]
    if args.lora_modules:
        argv += ["--lora-modules", *args.lora_modules]
    return argv


def node_parallel(args: argparse.Namespace, node: NodePlan, short: str) -> int | None:
    """The node's tensor- (``tp``) or pipeline-parallel (``pp``) size: its pool's flag
    (--prefill-tp / --decode-pp ...), else --tp / --pp; None leaves the node's default (1)."""
    pool = getattr(args, f"{node.role}_{short}", None) if node.role != "colocated" else None
    return pool if pool is not None else getattr(args, short, None)


def node_kv_cache_dtype(args: argparse.Namespace, command: str) -> str | None:
    """The pool's --prefill- / --decode-kv-cache-dtype, else --kv-cache-dtype (None: unset)."""
    pool = getattr(args, f"{command}_kv_cache_dtype", None)
    return pool if pool is not None else getattr(args, "kv_cache_dtype", None)


def node_gpu_share(args: argparse.Namespace) -> float:
    """Each node's part of --gpu-memory-utilization: the nodes of `up` share one GPU (with
    --planner, as many as the planner may start)."""
    nodes = args.decode if args.colocated else args.prefill + args.decode
    if getattr(args, "planner", False):
        nodes = args.max_prefill + args.max_decode
    return math.floor(args.gpu_memory_utilization / nodes * 10_000) / 10_000
