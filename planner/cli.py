"""`splitserve planner`: size the prefill and decode pools from TTFT / ITL targets.

It reads the registry (Redis) and the metrics, of the router and nodes directly
(--router-url) or from Prometheus (--prometheus-url), and serves its decision on
GET /metrics (`splitserve_planner_desired_replicas{pool}`) and GET /status.
"""

from __future__ import annotations

import argparse
import os
import sys

from cluster.listen import listener
from cluster.log_format import configure_logging
from cluster.settings import DEFAULT_REDIS_URL
from planner.config import PlannerConfig, PoolLimits

DEFAULT_PORT = 9400
REDIS_URL_ENV = "SPLITSERVE_REDIS_URL"  # as the router and nodes read it


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--redis-url", default=os.environ.get(REDIS_URL_ENV, DEFAULT_REDIS_URL),
        help=f"the cluster's registry (default: {REDIS_URL_ENV}, else {DEFAULT_REDIS_URL})",
    )  # fmt: skip
    parser.add_argument(
        "--router-url", action="append", default=[],
        help="a router whose /metrics to read (repeat for several); nodes come from the registry",
    )  # fmt: skip
    parser.add_argument("--prometheus-url", default=None, help="read the metrics from Prometheus")
    parser.add_argument("--ttft-slo-ms", type=float, default=1000.0, help="TTFT target (p90)")
    parser.add_argument("--itl-slo-ms", type=float, default=100.0, help="ITL target (p90)")
    for pool in ("prefill", "decode"):
        parser.add_argument(f"--min-{pool}", type=int, default=1, help=f"fewest {pool} nodes")
        parser.add_argument(f"--max-{pool}", type=int, default=4, help=f"most {pool} nodes")
    parser.add_argument("--interval-s", type=float, default=5.0, help="seconds between decisions")
    parser.add_argument("--horizon-intervals", type=int, default=2, help="predict this far ahead")
    parser.add_argument(
        "--scale-down-intervals", type=int, default=3,
        help="intervals in a row a smaller pool must fit before one node goes",
    )  # fmt: skip
    parser.add_argument("--up-cooldown-s", type=float, default=30.0)
    parser.add_argument("--down-cooldown-s", type=float, default=60.0)
    parser.add_argument(
        "--start-timeout-s", type=float, default=300.0,
        help="how long the nodes a scale-up asked for count as replicas before they register",
    )  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="serves /metrics, /status")
    parser.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="info"
    )


def config_of(args: argparse.Namespace) -> PlannerConfig:
    return PlannerConfig(
        ttft_slo_s=args.ttft_slo_ms / 1000,
        itl_slo_s=args.itl_slo_ms / 1000,
        prefill=PoolLimits(args.min_prefill, args.max_prefill),
        decode=PoolLimits(args.min_decode, args.max_decode),
        interval_s=args.interval_s,
        horizon_intervals=args.horizon_intervals,
        scale_down_intervals=args.scale_down_intervals,
        up_cooldown_s=args.up_cooldown_s,
        down_cooldown_s=args.down_cooldown_s,
        start_timeout_s=args.start_timeout_s,
    )


def run(args: argparse.Namespace) -> int:
    if bool(args.router_url) == bool(args.prometheus_url):
        print("splitserve planner: give --router-url or --prometheus-url (one)", file=sys.stderr)
        return 2
    try:
        config = config_of(args)
    except ValueError as exc:
        print(f"splitserve planner: {exc}", file=sys.stderr)
        return 2
    try:
        sock = listener(args.host, args.port)
    except OSError as exc:
        print(
            f"splitserve planner: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr
        )
        return 1
    import httpx
    import uvicorn

    from cluster.registry import Membership
    from planner.planner import Planner
    from planner.service import PlannerService, create_app
    from planner.sources import DirectSource, PrometheusSource, Source

    configure_logging(args.log_level)
    http = httpx.AsyncClient(timeout=min(5.0, config.interval_s), trust_env=False)
    source: Source = (
        PrometheusSource(args.prometheus_url, http)
        if args.prometheus_url
        else DirectSource(args.router_url, http)
    )
    membership = Membership(args.redis_url, poll_s=config.interval_s)
    service = PlannerService(Planner(config), membership, source)
    server_config = uvicorn.Config(
        create_app(service), log_config=None, log_level=args.log_level, access_log=False
    )
    uvicorn.Server(server_config).run(sockets=[sock])
    return 0
