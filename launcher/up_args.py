"""The flags of `splitserve up` (launcher.up) and their checks.

Up's own flags (how many nodes, where the router listens, the planner) are written here; every
other flag is generated from the router's and the nodes' declarations (config_kit): one flag per
setting that `up` hands on, its `Up` mode saying how (launcher.up_plan hands it on).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

from config_kit import Declared, Up, add_flags, declared
from node.settings import NodeSettings
from planner.settings import PlannerSettings
from router.settings import RouterSettings

CHILDREN = (NodeSettings, RouterSettings, PlannerSettings)  # the settings of up's children
POOLS = ("prefill", "decode")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2", help="registry name or HF model dir")
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
    parser.add_argument(
        "--run-dir", default=None,
        help="where each process's NAME.log, cluster.json (URLs, process ids) and the header "
        "files for curl -H @FILE go: cluster-token.header (a node's /stats needs it) and "
        "api-key.header (default: a new temporary directory)",
    )  # fmt: skip
    parser.add_argument("--ready-timeout-s", type=float, default=300.0)
    add_handed_on(parser)
    add_planner_arguments(parser)


def handed_on() -> Iterator[Declared]:
    """The settings of up's children that `up` takes as flags, one per name (a name the
    router and the nodes both declare is handed to both)."""
    seen: set[str] = set()
    for cls in CHILDREN:
        for d in declared(cls):
            if d.setting.up is not Up.OWN and d.name not in seen:
                seen.add(d.name)
                yield d


def add_handed_on(parser: argparse.ArgumentParser) -> None:
    """A flag per setting up hands on; a POOL setting's --prefill- / --decode- variants too."""
    settings = list(handed_on())
    add_flags(parser.add_argument_group("the router's and the nodes' settings"), settings)
    pools = parser.add_argument_group("one pool's nodes (default: the flag above)")
    for pool in POOLS:

        def help_of(d: Declared, pool: str = pool) -> str:
            return f"{pool} nodes: {d.flag}"

        add_flags(
            pools, [d for d in settings if d.setting.up is Up.POOL], prefix=f"{pool}-",
            dest_prefix=f"{pool}_", help_of=help_of,
        )  # fmt: skip


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
    """ValueError naming the first bad flag of up's own."""
    if args.decode < 1:
        raise ValueError("--decode must be >= 1")
    if not args.colocated and args.prefill < 1:
        raise ValueError("--prefill must be >= 1 (or use --colocated)")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535] (0: any free port), got {args.port}")
    if args.colocated:
        for d in handed_on():
            if any(pool_value(args, d, pool) is not None for pool in POOLS):
                raise ValueError(
                    f"--prefill-* / --decode-* set one pool's nodes: use {d.flag} with --colocated"
                )
    if args.planner:
        if args.colocated:
            raise ValueError("--planner sizes a prefill and a decode pool: not with --colocated")
        if args.max_prefill < args.prefill or args.max_decode < args.decode:
            raise ValueError("--max-prefill / --max-decode must be >= --prefill / --decode")


def pool_value(args: argparse.Namespace, d: Declared, pool: str) -> Any:
    """The value of `d`'s --POOL- variant (None: not given, or `d` has none)."""
    return getattr(args, f"{pool}_{d.name}", None) if d.setting.up is Up.POOL else None
