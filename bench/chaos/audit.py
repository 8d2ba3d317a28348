"""After a fault heals and its requests end: is the cluster whole and clean again?

Clean means: every node answers /stats with no request running or waiting, no lease held
and its free KV blocks back at the idle count; the router serves no request and knows every
node; the registry lists exactly the nodes that run; and every host runs exactly its one
process (no restarted node's predecessor, no stray child). `wait_clean` polls until it is,
or until its time is up and says what is still wrong.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import httpx
import redis

from bench.chaos.cluster import NODES, ChaosCluster

POLL_S = 0.25
_INFLIGHT = re.compile(rb"^splitserve_router_(?:inflight|queued)_requests\{[^}]*\} (\S+)$", re.M)


@dataclass
class Audit:
    clean: bool
    took_s: float
    problems: list[str] = field(default_factory=list)
    leaked_blocks: int = 0  # blocks not back at the idle count, summed over the nodes


def inspect(cluster: ChaosCluster) -> Audit:
    """One look at the cluster (took_s left 0)."""
    problems: list[str] = []
    leaked = 0
    for name in NODES:
        try:
            load = cluster.stats(name).load
        except (httpx.HTTPError, OSError) as exc:
            problems.append(f"{name}: no /stats ({type(exc).__name__})")
            continue
        leaked += max(cluster.idle_free[name] - load.free_blocks, 0)
        busy = (load.running, load.waiting, load.leases_held)
        if busy != (0, 0, 0) or load.free_blocks != cluster.idle_free[name]:
            problems.append(
                f"{name}: running={load.running} waiting={load.waiting} "
                f"leases={load.leases_held} free={load.free_blocks}/{cluster.idle_free[name]}"
            )
    problems += _router(cluster) + _registry(cluster) + _processes(cluster)
    return Audit(not problems, 0.0, problems, leaked)


def _router(cluster: ChaosCluster) -> list[str]:
    try:
        metrics = httpx.get(cluster.router_url + "/metrics", timeout=5, trust_env=False)
        if not cluster.router_knows_all():
            return ["router: does not list every node as ready"]
    except (httpx.HTTPError, OSError) as exc:
        return [f"router: unreachable ({type(exc).__name__})"]
    busy = sum(float(v) for v in _INFLIGHT.findall(metrics.content))
    return [f"router: {busy:.0f} requests in flight or queued"] if busy else []


def _registry(cluster: ChaosCluster) -> list[str]:
    try:
        listed = cluster.registry()
    except (redis.RedisError, OSError) as exc:
        return [f"registry: unreachable ({type(exc).__name__})"]
    live = {n for n in NODES if cluster.net.pids(n)}
    return [] if listed == live else [f"registry lists {sorted(listed)}, live: {sorted(live)}"]


def _processes(cluster: ChaosCluster) -> list[str]:
    cluster.net.reap()
    out = []
    for name in cluster.net.hosts:
        pids = cluster.net.pids(name)
        if len(pids) != 1:
            out.append(f"host {name}: {len(pids)} processes, expected 1")
    if cluster.net.strays():
        out.append(f"strays: {cluster.net.strays()}")
    return out


def wait_clean(cluster: ChaosCluster, timeout_s: float) -> Audit:
    """Poll until clean; the last look, with the seconds it took."""
    start = time.monotonic()
    while True:
        audit = inspect(cluster)
        audit.took_s = time.monotonic() - start
        if audit.clean or audit.took_s > timeout_s:
            return audit
        time.sleep(POLL_S)
