"""What `splitserve up` starts: the nodes it plans (name, role, port), the values it hands each
child (launcher.up starts them) and their command lines and environments.

A child gets the settings its class declares that up took as flags, each by its `Up` mode:
EACH as given, POOL its pool's variant first, DECODE on decode and colocated nodes only, SHARE
an equal part for each node, SUBDIR a subdirectory per node; a secret goes in its variable,
never on a command line. Up sets the OWN ones itself (addresses, ports, ids).
"""

from __future__ import annotations

import argparse
import math
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.listen import bound_port, open_listener
from config_kit import Declared, Secret, Up, declared, load
from launcher.up_args import POOLS, pool_value
from node.settings import NodeSettings
from planner.settings import PlannerSettings
from router.settings import RouterSettings


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


def node_kinds(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(command, role) of each kind of node up starts."""
    if args.colocated:
        return [("decode", "colocated")]
    return [("prefill", "prefill"), ("decode", "decode")]


def plan_nodes(args: argparse.Namespace) -> list[NodePlan]:
    counts = {"prefill": args.prefill, "decode": args.decode, "colocated": args.decode}
    return [
        NodePlan.bound(f"{role}-{i}", command, role)
        for command, role in node_kinds(args)
        for i in range(counts[role])
    ]


def child_values(
    args: argparse.Namespace, cls: type, node: NodePlan | None = None
) -> dict[str, Any]:
    """Public name -> value of each of `cls`'s settings up hands this child (`node`: which
    node), by the setting's `Up` mode; what up was not given stays unset."""
    out = {}
    for d in declared(cls):
        value = _value(args, d, node)
        if value is not None:
            out[d.name] = value
    return out


def _value(args: argparse.Namespace, d: Declared, node: NodePlan | None) -> Any:
    mode = d.setting.up
    value = getattr(args, d.name, None) if mode is not Up.OWN else None
    if node is None:
        return value
    if mode is Up.POOL and node.role in POOLS:
        pool = pool_value(args, d, node.role)
        return pool if pool is not None else value
    if mode is Up.DECODE:
        return value if node.command == "decode" else None
    if mode is Up.SHARE:
        return node_share(args, value if value is not None else d.default)
    if mode is Up.SUBDIR and value is not None:
        return Path(value) / node.name  # one directory per node
    return value


def child_argv(values: dict[str, Any], cls: type) -> list[str]:
    """The flags of `values` (a secret's go in the environment: child_env)."""
    argv: list[str] = []
    for d in declared(cls):
        value = values.get(d.name)
        if value is None or d.kind is Secret:
            continue
        if d.kind is bool:
            argv.append(d.flag if value else "--no-" + d.flag.removeprefix("--"))
        elif d.kind is list:
            argv += [d.flag, *map(str, value)]
        else:
            argv += [d.flag, str(value)]
    return argv


def child_env(values: dict[str, Any], cls: type, env: dict[str, str]) -> dict[str, str]:
    """`env` with the secrets of `values` in their variables."""
    secrets = {
        d.env: values[d.name].get_secret_value()
        for d in declared(cls)
        if d.kind is Secret and d.name in values
    }
    return dict(env, **secrets) if secrets else env


def check_children(args: argparse.Namespace) -> RouterSettings:
    """The router's and each kind of node's settings as they will read them (the flags, else
    their SPLITSERVE_* variables), checked before anything starts; SettingsError (a
    ValueError) names the bad one. The router's, for its API keys."""
    for command, role in node_kinds(args):
        probe = NodePlan(f"{role}-0", command, role, 0)
        load(NodeSettings, child_values(args, NodeSettings, probe), command=role)
    router = load(RouterSettings, child_values(args, RouterSettings))
    router.api_keys()
    return router


def router_environment(args: argparse.Namespace, env: dict[str, str]) -> dict[str, str]:
    """The router's environment: the children's, with the secrets up hands it (its API key)."""
    return child_env(child_values(args, RouterSettings), RouterSettings, env)


def _cli() -> list[str]:
    return [sys.executable, "-m", "launcher.cli"]


def router_argv(args: argparse.Namespace, model: Path, redis_url: str) -> list[str]:
    argv = [*_cli(), "router", "--host", args.host, "--port", str(args.port)]
    argv += ["--redis-url", redis_url, "--model", str(model)]
    return argv + child_argv(child_values(args, RouterSettings), RouterSettings)


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
    return argv + child_argv(child_values(args, PlannerSettings), PlannerSettings)


def local_host(host: str) -> str:
    """The address to reach a server of this machine listening on `host`."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def node_argv(args: argparse.Namespace, model: Path, redis_url: str, node: NodePlan) -> list[str]:
    argv = [*_cli(), node.command, "--host", "127.0.0.1", "--port", str(node.port)]
    argv += ["--redis-url", redis_url, "--model", str(model), "--node-id", node.name]
    if node.command == "decode":
        argv += ["--role", node.role]
    return argv + child_argv(child_values(args, NodeSettings, node), NodeSettings)


def node_share(args: argparse.Namespace, total: float) -> float:
    """Each node's part of a SHARE setting (the GPU's memory): the nodes of `up` share one
    GPU (with --planner, as many as the planner may start)."""
    nodes = args.decode if args.colocated else args.prefill + args.decode
    if getattr(args, "planner", False):
        nodes = args.max_prefill + args.max_decode
    return math.floor(total / nodes * 10_000) / 10_000
