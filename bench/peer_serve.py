"""bench.peers' serving comparison: ``vllm serve`` against ``splitserve up --colocated`` and
1P+1D, each started fresh (cold caches), under bench.serve's client and workload.

Per server and round: the ``chat`` workload capped to 256 prompt and 32 output tokens, 32
requests with Poisson arrivals at 1 request/s (``--serve-rate``, ``--serve-requests``), one
untimed warm-up request first (its prompt differs: no cache hit), then TTFT p50 / p99 and
TPOT p50. Servers take turns within a round. Threads: the machine's torch thread count for
vLLM and the colocated node, half each for the prefill and the decode node of 1P+1D (they
share the cores), at least one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import torch

from bench.serve import DEFAULT_SLO, ServeConfig, run_sweep
from bench.serve_client import LoadOptions

READY_TIMEOUT_S = 900.0
SERVERS = {
    "vllm": "vllm serve (colocated)",
    "colocated": "splitserve up --colocated",
    "1p1d": "splitserve up, 1 prefill + 1 decode",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def vllm_server(args: argparse.Namespace, log: Path) -> Iterator[str]:
    """``vllm serve`` of the fp32 conversion in the peer's Python; its base URL."""
    port, threads = _free_port(), torch.get_num_threads()
    argv = [args.peer_pythons["vllm"], "-m", "vllm.entrypoints.openai.api_server", "--model",
            str(args.model_dir), "--port", str(port), "--host", "127.0.0.1", "--dtype",
            args.vllm_dtype, "--max-model-len", "2048", "--seed", "0"]  # fmt: skip
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    env.pop("PYTHONPATH", None)
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            argv, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, url, log)
        yield url
    finally:
        _stop(proc)


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/v1/models", timeout=5, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    tail = log.read_text(errors="replace")[-1500:]
    raise RuntimeError(f"the server at {url} did not come up (exit {proc.poll()}):\n{tail}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@contextmanager
def splitserve_up(args: argparse.Namespace, layout: str, run_dir: Path) -> Iterator[str]:
    """``splitserve up`` colocated or 1P+1D on the CPU in fp32, default settings otherwise."""
    from bench.policy_sweep import Up

    threads = torch.get_num_threads()
    up_args = ["--model", str(args.model_dir), "--device", "cpu", "--dtype", "float32"]
    if layout == "colocated":
        up_args.append("--colocated")
    else:
        threads = max(1, threads // 2)
    spec = SimpleNamespace(prefill=1, decode=1, up_args=up_args, threads_per_node=threads)
    up = Up("kv_aware", spec, run_dir)  # type: ignore[arg-type]
    try:
        yield up.url
    finally:
        up.stop()


def _config(args: argparse.Namespace, url: str, label: str) -> ServeConfig:
    return ServeConfig(
        url=url, model=None, workload="chat", rates=(args.serve_rate,),
        num_requests=args.serve_requests, duration_s=None, max_prompt=256, max_output=32,
        vocab_size=args.vocab, seed=args.seed, slo=DEFAULT_SLO,
        load=LoadOptions(300.0, progress=False), warmup=1, label=label,
    )  # fmt: skip


def measure(args: argparse.Namespace, server: str, work: Path) -> dict[str, Any]:
    """One fresh server of kind ``server``: the point's TTFT / TPOT and the machine's load."""
    work.mkdir(parents=True, exist_ok=True)
    if server == "vllm":
        ctx = vllm_server(args, work / "vllm.log")
    else:
        ctx = splitserve_up(args, server, work / server)
    try:
        with ctx as url:
            result = asyncio.run(run_sweep(_config(args, url, server), None))
    except RuntimeError as exc:
        return {"error": str(exc)[-1500:]}
    s = result["points"][0]["summary"]
    return {
        "ttft_p50_ms": s["ttft_ms"]["p50"], "ttft_p99_ms": s["ttft_ms"]["p99"],
        "tpot_p50_ms": s["tpot_ms"]["p50"], "completed": s["completed"],
        "failed": s["failed"], "load_1m": os.getloadavg()[0],
    }  # fmt: skip


def serve_rounds(args: argparse.Namespace, with_vllm: bool) -> dict[str, Any]:
    """Every round: each server fresh, in the same order."""
    servers = [s for s in SERVERS if with_vllm or s != "vllm"]
    rounds = []
    with tempfile.TemporaryDirectory(prefix="peers-serve-") as tmp:
        for i in range(args.rounds):
            entry = {}
            for server in servers:
                print(f"round {i + 1}: serve on {server} ...", file=sys.stderr, flush=True)
                entry[server] = measure(args, server, Path(tmp) / f"r{i}")
            rounds.append(entry)
    return {"rate": args.serve_rate, "requests": args.serve_requests, "rounds": rounds}


def serve_table(serve: dict[str, Any]) -> str:
    lines = [f"serving, chat workload (256 / 32 tokens), rate {serve['rate']:g} req/s, "
             f"{serve['requests']} requests, cold servers:"]  # fmt: skip
    for i, entry in enumerate(serve["rounds"]):
        for server, r in entry.items():
            if "error" in r:
                lines.append(f"  round {i + 1} {SERVERS[server]:<40} failed: {r['error'][-200:]}")
                continue
            lines.append(
                f"  round {i + 1} {SERVERS[server]:<40} TTFT p50 {r['ttft_p50_ms']:7.1f} ms  "
                f"p99 {r['ttft_p99_ms']:7.1f} ms  TPOT p50 {r['tpot_p50_ms']:6.1f} ms  "
                f"(load {r['load_1m']:.1f})"
            )
    return "\n".join(lines)
