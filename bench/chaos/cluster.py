"""A splitserve cluster spread over the hosts of a HostNet: Redis, the router, 2 prefill and 2
decode nodes, each on its own host, started with the real command line (`python -m
launcher.cli ...` under `ip netns exec`), the default model in float32 with a small KV cache
and 1 torch thread per node. KV moves over TCP or NIXL (UCX over TCP: processes in other
network namespaces of one machine would otherwise share memory, past any network fault).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis

from bench.chaos.netns import INNER_DEV, HostNet
from cluster.auth import CLUSTER_TOKEN_HEADER
from cluster.node_records import NodeStats
from cluster.settings import CLUSTER_TOKEN_ENV
from launcher.redis_server import server_argv

PREFILL = ("prefill-0", "prefill-1")
DECODE = ("decode-0", "decode-1")
NODES = (*PREFILL, *DECODE)
HOSTS = ("router", "redis", *NODES)
ROUTER_PORT, REDIS_PORT, NODE_PORT, TRANSFER_PORT = 8000, 6379, 8100, 8200
TOKEN = "chaos-cluster-token-0123456789abcdef"
START_TIMEOUT_S = 300.0
NODE_KEYS = "splitserve:node:*"


class ClusterError(RuntimeError):
    """A process did not start, or exited; the message ends with its log's last lines."""


@dataclass(frozen=True)
class ClusterConfig:
    model_dir: Path
    run_dir: Path
    transfer: str = "tcp"  # or "nixl"
    num_kv_blocks: int = 256  # per node: 4096 tokens of 16
    torch_threads: int = 1

    def __post_init__(self) -> None:
        if self.transfer not in ("tcp", "nixl"):
            raise ValueError(f"transfer must be tcp or nixl, got {self.transfer!r}")
        if self.num_kv_blocks < 16:
            raise ValueError(f"num_kv_blocks must be >= 16, got {self.num_kv_blocks}")


class ChaosCluster:
    """The processes of the cluster, one host each; `idle_free` holds each node's free KV
    blocks once it first went idle (the count every fault must come back to); `trees` the
    source tree a node runs from (absent: this one), e.g. an older release's worktree."""

    def __init__(self, net: HostNet, config: ClusterConfig) -> None:
        self.net = net
        self.config = config
        self.idle_free: dict[str, int] = {}
        self.trees: dict[str, Path] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}  # the last started on each host
        self._http = httpx.Client(timeout=5.0, trust_env=False)
        self._redis = redis.Redis(host=net.address("redis"), port=REDIS_PORT, socket_timeout=5)
        config.run_dir.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------ addresses

    @property
    def router_url(self) -> str:
        return f"http://{self.net.address('router')}:{ROUTER_PORT}"

    def node_url(self, name: str) -> str:
        return f"http://{self.net.address(name)}:{NODE_PORT}"

    @property
    def redis_url(self) -> str:
        return f"redis://{self.net.address('redis')}:{REDIS_PORT}/0"

    # ------------------------------------------------------------ processes

    def start(self) -> None:
        """Redis, the four nodes and the router; returns once the router knows every node."""
        workdir = self.config.run_dir / "redis"
        workdir.mkdir(exist_ok=True)
        argv = server_argv(self.net.address("redis"), REDIS_PORT, str(workdir))
        self._procs["redis"] = self.net.popen("redis", argv, self._log("redis"))
        self._wait(lambda: self._redis.ping(), "redis")
        for name in NODES:
            self.start_node(name, wait=False)
        self.start_router(wait=False)
        for name in NODES:
            self.wait_node(name)
        self.wait_router()
        for name in NODES:
            self.idle_free[name] = self.stats(name).load.free_blocks

    def start_router(self, wait: bool = True) -> None:
        """The router, from its tree; with `wait`, until it knows every node."""
        tree = self.trees.get("router")
        argv = self._cli("router", "router", "--port", str(ROUTER_PORT), tree=tree)
        argv += ["--redis-url", self.redis_url, "--model", str(self.config.model_dir)]
        self._procs["router"] = self.net.popen(
            "router", argv, self._log("router"), *self._run_in(tree)
        )
        if wait:
            self.wait_router()

    def wait_router(self) -> None:
        """Until the router knows every node."""
        self._wait(self.router_knows_all, "router")

    def _run_in(self, tree: Path | None) -> tuple[dict[str, str], Path | None]:
        """The environment and working directory of a process from `tree` (None: this one)."""
        env = self._env() if tree is None else dict(self._env(), PYTHONPATH=str(tree))
        return env, tree

    def start_node(self, name: str, wait: bool = True) -> None:
        command = "prefill" if name in PREFILL else "decode"
        tree = self.trees.get(name)
        argv = self._cli(command, name, "--port", str(NODE_PORT), "--node-id", name, tree=tree)
        argv += ["--redis-url", self.redis_url, "--model", str(self.config.model_dir)]
        argv += ["--device", "cpu", "--dtype", "float32", "--transfer", self.config.transfer]
        argv += ["--transfer-port", str(TRANSFER_PORT), "--num-kv-blocks"]
        argv += [str(self.config.num_kv_blocks), "--torch-threads", str(self.config.torch_threads)]
        self._procs[name] = self.net.popen(name, argv, self._log(name), *self._run_in(tree))
        if wait:
            self.wait_node(name)

    def started(self, name: str) -> bool:
        """Whether the process last started on host `name` still runs (or starts)."""
        proc = self._procs.get(name)
        return proc is not None and proc.poll() is None

    def wait_node(self, name: str) -> None:
        self._wait(lambda: self._get(self.node_url(name) + "/ready") == 200, name)

    def _cli(self, command: str, host: str, *args: str, tree: Path | None = None) -> list[str]:
        argv = [sys.executable, "-m", _cli_module(tree), command]
        return [*argv, "--host", self.net.address(host), *args]

    def _env(self) -> dict[str, str]:
        env = dict(os.environ, **{CLUSTER_TOKEN_ENV: TOKEN})
        env.update(UCX_TLS="tcp", UCX_NET_DEVICES=INNER_DEV, OMP_NUM_THREADS="1")
        for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy"):
            env.pop(proxy, None)
        return env

    def _log(self, name: str) -> Path:
        return self.config.run_dir / f"{name}.log"

    def _wait(self, ready: Callable[[], object], name: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if ready():
                    return
            except (httpx.HTTPError, redis.RedisError, OSError):
                pass
            if self._procs[name].poll() is not None:  # (a new one may not be in its host yet)
                raise ClusterError(f"{name} exited at start:\n{self.log_tail(name)}")
            if time.monotonic() > deadline:
                raise ClusterError(f"{name} not ready in {START_TIMEOUT_S:.0f}s:\n"
                                   f"{self.log_tail(name)}")  # fmt: skip
            time.sleep(0.2)

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self._log(name)
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    # ------------------------------------------------------------ observing

    def _get(self, url: str) -> int:
        return self._http.get(url).status_code

    def router_knows_all(self) -> bool:
        resp = self._http.get(self.router_url + "/ready")
        if resp.status_code != 200:
            return False
        body = resp.json()
        return bool(body["prefill_nodes"] == len(PREFILL) and body["decode_nodes"] == len(DECODE))

    def stats(self, name: str) -> NodeStats:
        resp = self._http.get(self.node_url(name) + "/stats", headers={CLUSTER_TOKEN_HEADER: TOKEN})
        resp.raise_for_status()
        return NodeStats.model_validate_json(resp.content)

    def registry(self) -> set[str]:
        """Node ids the registry lists now."""
        return {k.decode().rsplit(":", 1)[1] for k in self._redis.scan_iter(match=NODE_KEYS)}

    def close(self) -> None:
        self._http.close()
        self._redis.close()


@contextmanager
def running(net: HostNet, config: ClusterConfig) -> Iterator[ChaosCluster]:
    cluster = ChaosCluster(net, config)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


def _cli_module(tree: Path | None) -> str:
    """The command's module in a source tree: this one's, or an older release's (v0.1.0 kept
    the command in cluster/, before the launcher had a package of its own)."""
    if tree is None or (tree / "launcher" / "cli.py").exists():
        return "launcher.cli"
    return "cluster.cli"
