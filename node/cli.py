"""The command line shared by `splitserve prefill` and `splitserve decode`, and the server
runner (uvicorn + uvloop).

Every flag overrides its SPLITSERVE_* environment variable (cluster.settings.NodeSettings);
flag names are the settings' names with dashes. The listening socket is bound before the
model loads: a port in use fails at once, and calls that arrive while the node starts wait
in the socket's backlog instead of being refused.
"""

from __future__ import annotations

import argparse
import socket
import sys
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cluster.listen import listener
from cluster.log_format import configure_logging
from cluster.settings import NodeSettings, SettingsError, load
from cluster.up_args import TRACE_FLAGS
from engine.flags import ENGINE_FLAGS, LORA_SWITCHES, add_lora_switches, flag
from models import resolve_model
from models.cli import MODEL_CACHE_HELP, add_model_cache_flag

_HELP: dict[str, str] = {
    "host": "address to listen on (default 127.0.0.1)",
    "port": "HTTP port (default 8100)",
    "redis_url": "Redis holding the cluster registry",
    "model": "model registry name (pulled) or HF model directory",
    "model_cache": MODEL_CACHE_HELP,
    "device": "where the engine runs",
    "dtype": "weights and KV cache dtype (auto: bfloat16 on CUDA, float32 on CPU)",
    "quantization": ENGINE_FLAGS["quantization"],
    "float32_matmul_precision": "highest (every product fp32-accurate) or medium (torch's "
    "name: on AMX CPUs the packed layers' products over many rows take bf16 inputs, summed in "
    "fp32: a bf16 model's precision, prefill about 2x faster)",
    "block_size": "tokens per KV block",
    "num_kv_blocks": "KV blocks to allocate (else sized by memory)",
    "kv_cache_memory_gb": "memory for the KV cache, in GiB (default: on CUDA sized by "
    "--gpu-memory-utilization, on CPU 1)",
    "kv_cache_dtype": ENGINE_FLAGS["kv_cache_dtype"],
    "gpu_memory_utilization": "CUDA: share of the GPU's memory for weights, activations and "
    "KV cache together, when neither --num-kv-blocks nor --kv-cache-memory-gb is set "
    "(default 0.9)",
    "kv_offload_cpu_gb": "GiB of host memory (pinned on CUDA) for KV blocks evicted from the "
    "device and for preempted requests swapped out (default: no host tier)",
    "kv_offload_disk_path": "directory for KV block files that outlive a restart (an emptyDir or "
    "a volume; needs --kv-offload-cpu-gb and --kv-offload-disk-gb)",
    "kv_offload_disk_gb": "GiB of KV block files under --kv-offload-disk-path",
    "max_num_seqs": "requests batched together at most (default 256 on CUDA, 64 on CPU)",
    "max_num_batched_tokens": "tokens computed per engine step at most",
    "max_model_len": "context length (default: the model's)",
    "tensor_parallel_size": "ranks the model is split over, one process each (GPUs: one each)",
    "pipeline_parallel_size": "layer stages, each of tensor_parallel_size ranks (GPUs: TP x PP)",
    "transfer": "KV transport: nixl, tcp, or auto (NIXL when available)",
    "transfer_port": "TCP port of the KV block server (0: any free port)",
    "transfer_failure": "decode: what a failed KV transfer does",
    "lease_ttl_s": "prefill: seconds a KV lease lives without a release",
    "max_queued_imports": "decode: KV imports that may wait for blocks at once (default: "
    "--max-num-seqs)",
    "import_wait_s": "decode: longest wait of a KV import for blocks (then 503)",
    "heartbeat_s": "seconds between registry heartbeats",
    "ttl_s": "registry TTL: the node disappears this long after its last heartbeat",
    "node_id": "node id in the registry (default: ROLE-HOSTNAME-PORT)",
    "advertise_host": "host others use to reach this node (default: --host)",
    "torch_threads": "torch CPU threads of the engine",
    "speculative_method": "speculative decoding on decode and colocated nodes: none, ngram "
    "(prompt lookup) or draft (a smaller model, --draft-model)",
    "num_speculative_tokens": "speculative decoding: tokens guessed per step and request at most "
    "(1 to 16, default 4)",
    "draft_model": "speculative decoding: the draft model (registry name or HF directory, same "
    "vocabulary as --model)",
    "max_loras": ENGINE_FLAGS["max_loras"],
    "max_lora_rank": ENGINE_FLAGS["max_lora_rank"],
    "max_cpu_loras": ENGINE_FLAGS["max_cpu_loras"],
    "drain_timeout_s": "after SIGTERM: seconds running requests get to finish",
    "log_level": "log level",
    **{flag.removeprefix("--").replace("-", "_"): text for flag, _, text in TRACE_FLAGS},
}


def add_node_arguments(parser: argparse.ArgumentParser, roles: Sequence[str]) -> None:
    """The node flags; `--role` only when the command serves more than one role."""
    for name, help_text in _HELP.items():
        kind, choices = _arg_type(NodeSettings.model_fields[name].annotation)
        parser.add_argument(flag(name), type=kind, choices=choices, default=None, help=help_text)
    add_model_cache_flag(parser, alias_only=True)
    add_lora_switches(parser)
    if len(roles) > 1:
        parser.add_argument("--role", choices=list(roles), default=None, help=f"default {roles[0]}")


def _arg_type(annotation: Any) -> tuple[Callable[[str], Any], list[str] | None]:
    """argparse type and choices for a settings field: Literal -> choices, X | None -> X."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is typing.Literal:
        return str, [str(a) for a in typing.get_args(annotation)]
    if annotation in (int, float):
        return typing.cast(Callable[[str], Any], annotation), None
    if annotation is not str and annotation is not Path:
        raise TypeError(f"no command-line type for {annotation!r}")
    return str, None


def settings_from_args(args: argparse.Namespace, role: str) -> NodeSettings:
    """NodeSettings from the environment and the flags; SettingsError names bad values."""
    overrides = {name: getattr(args, name, None) for name in (*_HELP, *LORA_SWITCHES)}
    return load(NodeSettings, role=role, **overrides)


def run_node(
    args: argparse.Namespace, role: str, app_factory: Callable[[NodeSettings], Any]
) -> int:
    """Parse settings, bind the port, check the model directories, build the app with
    `app_factory` and serve it until SIGINT / SIGTERM. Exit codes: 2 bad settings or model,
    1 port unavailable, 3 start failed, 4 the node stopped itself (a tensor-parallel rank
    died)."""
    try:
        settings = settings_from_args(args, role)
    except SettingsError as exc:
        print(exc, file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    try:
        sock = listener(settings.host, settings.port)
    except OSError as exc:
        print(f"cannot listen on {settings.host}:{settings.port}: {exc}", file=sys.stderr)
        return 1
    try:
        for model in filter(None, (settings.model, settings.draft_model)):
            resolve_model(model, settings.model_cache)  # before torch loads: one line
    except (ValueError, LookupError) as exc:
        sock.close()
        print(exc, file=sys.stderr)
        return 2
    return serve(app_factory(settings), sock, settings)


def serve(app: Any, sock: socket.socket, settings: NodeSettings) -> int:
    """Run `app` on `sock` with uvicorn and uvloop until SIGTERM / SIGINT, which drain the
    node (node.drain); 3 when its lifespan failed to start."""
    import uvicorn

    from node.drain import DrainingServer
    from node.server import begin_drain

    config = uvicorn.Config(
        app,
        loop="uvloop",
        lifespan="on",
        log_config=None,
        log_level=settings.log_level,
        access_log=False,
        timeout_graceful_shutdown=max(1, round(settings.drain_timeout_s)),
    )
    server = DrainingServer(config, lambda: begin_drain(app))
    app.state.node.exit_on_fatal = server.fail
    server.run(sockets=[sock])
    return server.exit_code if server.started else 3
