"""`splitserve up`: a whole cluster on this machine, in child processes.

Pulls the model when missing, starts an embedded Redis (unless --redis), the router and
N prefill + M decode nodes (default 1 + 1; --colocated: M colocated nodes instead), and
waits until every node and the router are ready, showing each node's start-up phases as they
pass (launcher.up_progress). The launcher binds every child's port itself and hands the socket
over (cluster.listen), so no other process can take it in between; `--port 0` lets the
kernel pick the router's. Then it prints the URL and an example request that works as printed
(launcher.up_announce), and runs until Ctrl-C or SIGTERM, when it stops every process it
started (SIGTERM, then SIGKILL after a grace period), Redis last.
A launcher that dies anyhow takes its children along (PR_SET_PDEATHSIG).

Logs: each child writes to RUN_DIR/NAME.log (RUN_DIR: --run-dir or a new temporary
directory, printed at start). RUN_DIR/cluster.json, written as the children start, holds
the router URL, the Redis URL, each node's URL and every process id (launcher included);
RUN_DIR/cluster-token.header and api-key.header (mode 0600) serve curl's `-H @FILE`.
A node that exits is reported and the cluster keeps serving without it. An embedded Redis that
dies is restarted on the same port (launcher.redis_supervisor); when the router exits, or Redis
keeps dying, the launcher stops everything and exits 1. Every run gets its own cluster token
(SPLITSERVE_CLUSTER_TOKEN in the children's environment, unless already set). `--api-key`
reaches the router in its environment (SPLITSERVE_API_KEY), never on a command line. Every
setting of the router and the nodes is also a flag of `up`, handed to each child that declares
it (launcher.up_plan); the router's and each node's settings (its key flags too) are checked
before anything starts.
With --planner a `splitserve planner` child sizes the two pools from TTFT / ITL targets, and
the launcher starts and drains nodes to follow it (launcher.scaler); cluster.json follows.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import httpx

from cluster.auth import ApiKey, new_token
from cluster.listen import bound_port, open_listener
from cluster.settings import CLUSTER_TOKEN_ENV
from launcher.process import Child, stop_all
from launcher.redis_server import EmbeddedRedis
from launcher.redis_supervisor import RedisSupervisor
from launcher.scaler import LocalScaler
from launcher.up_announce import announcement
from launcher.up_args import add_arguments as add_arguments
from launcher.up_args import check_args
from launcher.up_layout import UpLayout, note_pid, write_headers
from launcher.up_plan import (
    NodePlan,
    check_children,
    node_argv,
    plan_nodes,
    planner_argv,
    router_argv,
    router_environment,
)
from launcher.up_progress import StartProgress

STOP_GRACE_S = 15.0
POLL_S = 0.25


class LaunchError(RuntimeError):
    """The cluster could not start; the message names the process and shows its log."""


def run(args: argparse.Namespace) -> int:
    try:
        check_args(args)
        keys = check_children(args).api_keys()
    except ValueError as exc:
        print(f"splitserve up: {exc}", file=sys.stderr)
        return 2
    try:
        router_sock = open_listener(args.host, args.port)  # a port in use fails before the pull
    except OSError as exc:
        print(f"splitserve up: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    args.port = bound_port(router_sock)  # --port 0: the kernel's pick, announced when up
    try:
        model = _ensure_model(args)
    except LaunchError as exc:
        router_sock.close()
        print(f"splitserve up: {exc}", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="splitserve-up-")).absolute()
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"logs: {run_dir}", flush=True)
    with _stop_on_sigterm():
        try:
            return _run_cluster(args, model, run_dir, router_sock, keys)
        except KeyboardInterrupt:
            return 0
        except LaunchError as exc:
            print(f"splitserve up: {exc}", file=sys.stderr, flush=True)
            return 1
        finally:
            router_sock.close()  # a no-op once the router holds it


def _ensure_model(args: argparse.Namespace) -> Path:
    from models import ensure_model

    cache = Path(args.model_cache) if args.model_cache else None
    try:
        return ensure_model(args.model, cache, True, args.load_format != "random")
    except Exception as exc:
        raise LaunchError(f"model {args.model!r}: {exc}") from None


@contextmanager
def _stop_on_sigterm() -> Iterator[None]:
    """SIGTERM and SIGINT stop the cluster like Ctrl-C does.

    SIGINT gets its handler explicitly: a shell script that starts the launcher in the
    background hands it SIGINT ignored, and Python then installs no handler of its own.
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signals = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _run_cluster(
    args: argparse.Namespace,
    model: Path,
    run_dir: Path,
    router_sock: socket.socket,
    keys: tuple[ApiKey, ...],
) -> int:
    redis = None
    children: list[Child] = []
    scaler: LocalScaler | None = None
    # One cluster token per run (unless the environment brings one): nodes take /internal/*
    # calls and KV handshakes only from this cluster's processes. It travels in env only (and
    # in RUN_DIR/cluster-token.header, which only this user may read, for /stats).
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault(CLUSTER_TOKEN_ENV, new_token())
    write_headers(run_dir, env[CLUSTER_TOKEN_ENV], keys[0] if keys else None)
    try:
        if args.redis:
            redis_url = args.redis
        else:
            redis = EmbeddedRedis(die_with_parent=True).start()
            redis_url = redis.url
        nodes = plan_nodes(args)
        router_env = router_environment(args, env)
        argv = router_argv(args, model, redis_url)
        children.append(_spawn(run_dir, "router", argv, router_env, router_sock))
        for node in nodes:
            argv = node_argv(args, model, redis_url, node)
            children.append(_spawn(run_dir, node.name, argv, env, node.listener))
        planner_url = None
        if args.planner:
            sock = open_listener("127.0.0.1", 0)
            port = bound_port(sock)
            argv = planner_argv(args, redis_url, port)
            children.append(_spawn(run_dir, "planner", argv, env, sock))
            planner_url = f"http://127.0.0.1:{port}"
        layout = UpLayout(run_dir, args, redis_url, nodes, children, redis, planner_url)
        layout.write()
        _wait_ready(args, children, nodes, run_dir)
        _say(announcement(args, model, nodes, run_dir, keys[0].name if keys else None))
        if planner_url is not None:

            def start(plan: NodePlan) -> Child:
                argv = node_argv(args, model, redis_url, plan)
                return _spawn(run_dir, plan.name, argv, env, plan.listener)

            scaler = LocalScaler(planner_url, start, nodes, children, layout.write)
        return _supervise(children, redis, run_dir, scaler)
    finally:
        if scaler is not None:
            scaler.close()
        if children or redis is not None:
            print("stopping...", flush=True)
        killed = stop_all(children, STOP_GRACE_S)
        if killed:
            print(f"killed (did not stop in {STOP_GRACE_S:.0f}s): {', '.join(killed)}")
        if redis is not None:
            redis.stop()
        if children:
            print("stopped", flush=True)


def _spawn(
    run_dir: Path,
    name: str,
    argv: list[str],
    env: dict[str, str],
    sock: socket.socket | None = None,
) -> Child:
    return Child(name, argv, run_dir / f"{name}.log", env, sock)


def _wait_ready(
    args: argparse.Namespace, children: list[Child], nodes: list[NodePlan], run_dir: Path
) -> None:
    """Until every node's /ready and the router's /ready (knowing all nodes) answer 200;
    meanwhile each node's start-up phases are shown as they pass (launcher.up_progress)."""
    deadline = time.monotonic() + args.ready_timeout_s
    pending = {n.name: f"{n.url}/ready" for n in nodes}
    router_url = f"http://127.0.0.1:{args.port}/ready"
    progress = StartProgress({n.name: run_dir / f"{n.name}.log" for n in nodes}, _say)
    with httpx.Client(timeout=2.0, trust_env=False) as http:
        while True:
            _check_alive(children)
            progress.poll()
            for name in [name for name, url in pending.items() if _ok(http, url)]:
                progress.ready(name)
                del pending[name]
            if not pending and _router_ready(http, router_url, nodes):
                return
            if time.monotonic() > deadline:
                waiting = ", ".join(pending) or "router"
                raise LaunchError(f"not ready after {args.ready_timeout_s:.0f}s: {waiting}")
            time.sleep(POLL_S)


def _check_alive(children: list[Child]) -> None:
    for child in children:
        code = child.exit_code()
        if code is not None:
            raise LaunchError(
                f"{child.name} exited with code {code} during start; "
                f"last lines of {child.log_path}:\n{child.log_tail()}"
            )


def _ok(http: httpx.Client, url: str) -> bool:
    try:
        return http.get(url).status_code == 200
    except httpx.HTTPError:
        return False


def _router_ready(http: httpx.Client, url: str, nodes: list[NodePlan]) -> bool:
    try:
        resp = http.get(url)
    except httpx.HTTPError:
        return False
    if resp.status_code != 200:
        return False
    body = resp.json()
    for role in ("prefill", "decode", "colocated"):
        if body.get(f"{role}_nodes", 0) < sum(n.role == role for n in nodes):
            return False
    return True


def _say(text: str) -> None:
    print(text, flush=True)


def _supervise(
    children: list[Child],
    redis: EmbeddedRedis | None,
    run_dir: Path,
    scaler: LocalScaler | None = None,
) -> int:
    """Run until interrupted; 1 when the router exits or Redis stays down (an embedded
    Redis that dies is restarted on its port, within RestartPolicy's budget); nodes may
    come and go."""
    reported: set[str] = set()
    keeper = None
    if redis is not None:
        keeper = RedisSupervisor(redis, on_restart=lambda pid: note_pid(run_dir, "redis", pid))
    while True:
        time.sleep(POLL_S)
        if keeper is not None:
            keeper.check()
            if keeper.gave_up:
                print("redis-server keeps dying; stopping the cluster", file=sys.stderr)
                return 1
        if scaler is not None:
            scaler.step()
        for child in children:
            code = child.exit_code()
            if code is None or child.name in reported:
                continue
            reported.add(child.name)
            if scaler is not None and child.name in scaler.draining:
                print(f"{child.name} drained (exit code {code})", flush=True)
                continue
            print(
                f"{child.name} exited with code {code}; last lines of {child.log_path}:\n"
                f"{child.log_tail(10)}",
                file=sys.stderr,
                flush=True,
            )
            if child.name == "router":
                return 1
