"""`splitserve planner`: size the prefill and decode pools from TTFT / ITL targets.

It reads the registry (Redis) and the metrics, of the router and nodes directly
(--router-url) or from Prometheus (--prometheus-url), and serves its decision on
GET /metrics (`splitserve_planner_desired_replicas{pool}`) and GET /status.
"""

from __future__ import annotations

import argparse
import sys

from cluster.listen import listener
from cluster.log_format import configure_logging
from config_kit import SettingsError, add_flags, given_flags, load
from planner.settings import PlannerSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, PlannerSettings)


def run(args: argparse.Namespace) -> int:
    try:
        settings = load(PlannerSettings, given_flags(args, PlannerSettings))
        config = settings.config.build()
    except (SettingsError, ValueError) as exc:
        print(f"splitserve planner: {exc}", file=sys.stderr)
        return 2
    try:
        sock = listener(settings.host, settings.port)
    except OSError as exc:
        print(
            f"splitserve planner: cannot listen on {settings.host}:{settings.port}: {exc}",
            file=sys.stderr,
        )
        return 1
    import httpx
    import uvicorn

    from cluster.registry import Membership
    from planner.planner import Planner
    from planner.service import PlannerService, create_app
    from planner.sources import DirectSource, PrometheusSource, Source

    configure_logging(settings.log_level)
    http = httpx.AsyncClient(timeout=min(5.0, config.interval_s), trust_env=False)
    source: Source = (
        PrometheusSource(settings.prometheus_url, http)
        if settings.prometheus_url
        else DirectSource(settings.router_url, http)
    )
    membership = Membership(settings.redis_url, poll_s=config.interval_s)
    service = PlannerService(Planner(config), membership, source)
    server_config = uvicorn.Config(
        create_app(service), log_config=None, log_level=settings.log_level, access_log=False
    )
    uvicorn.Server(server_config).run(sockets=[sock])
    return 0
