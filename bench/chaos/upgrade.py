"""A rolling upgrade under load: every node first runs an older release (a git worktree of its
tag, `v0.1.0` by default: protocol version 0) and so does the router; then, while requests
stream, the router, then each node in turn is drained (SIGTERM: a node leaves the registry,
ends its work, exits; the router finishes its open requests and exits) and started again on
this tree (routers first: a router serves nodes one protocol version older). While the router
is down a client's connection is refused: nothing was sent, a clear retriable failure. The
requests cycle through the session's fault-free ones, so each answer is checked against its
own; they stop once the last node is back. A request that failed clearly is sent again once,
and that answer must be identical.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx

from bench.chaos.audit import wait_clean
from bench.chaos.checker import judge
from bench.chaos.client import Outcome, run_all
from bench.chaos.cluster import NODES, ChaosCluster
from bench.chaos.faults import TRIGGER_WAIT_S, Fault, Injector
from bench.chaos.run import FaultRow, Load, RunConfig, Times, fault_row
from bench.chaos.workload import Spec

log = logging.getLogger("bench.chaos")

OLD_TAG = "v0.1.0"
DRAIN_WAIT_S = 90.0  # a node's drain gives its work 30 s
CYCLES = 20  # the fault-free requests, sent over and over until the roll ends
REPO = Path(__file__).resolve().parents[2]
ROLL = ("router", *NODES)  # routers first (docs/operations.md)
UPGRADE = Fault(
    "rolling-upgrade",
    f"the router and every node on {OLD_TAG}, then drained and started on this tree, one by one",
    lambda ctx: None, lambda ctx: None,
)  # fmt: skip


def unavailable_reason(tag: str = OLD_TAG) -> str | None:
    """Why no worktree of `tag` can be made here (None: it can)."""
    if shutil.which("git") is None:
        return "git is not installed"
    if not (REPO / ".git").exists():
        return f"{REPO} is not a git checkout"
    found = _git("rev-parse", "--verify", "--quiet", f"{tag}^{{commit}}", check=False)
    if found.returncode != 0:
        return f"the tag {tag} is not in this clone (a shallow clone? git fetch --tags)"
    return None


@contextmanager
def release_tree(tag: str = OLD_TAG) -> Iterator[Path]:
    """A detached git worktree of `tag` in a temp dir, removed on the way out."""
    parent = Path(tempfile.mkdtemp(prefix="splitserve-release-"))
    path = parent / tag
    _git("worktree", "add", "--detach", "--quiet", str(path), tag)
    try:
        yield path
    finally:
        _git("worktree", "remove", "--force", str(path), check=False)
        shutil.rmtree(parent, ignore_errors=True)


def _git(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=check
    )


def run_upgrade(
    cluster: ChaosCluster,
    specs: Sequence[Spec],
    expected: Sequence[Outcome],
    cfg: RunConfig,
    old_tree: Path,
) -> FaultRow:
    """The router and every node onto `old_tree`, then rolled back to this tree one by one
    under load."""
    ctx = Injector(cluster)
    _onto(cluster, ctx, old_tree)
    ctx.notes.append(f"every process on {old_tree.name}")
    cycled = [
        dataclasses.replace(specs[i % len(specs)], index=i) for i in range(CYCLES * len(specs))
    ]
    answers = [expected[i % len(specs)] for i in range(len(cycled))]
    load, times = Load(cluster, cycled, cfg), Times()
    times.start = time.monotonic()
    load.start()
    while load.is_alive() and load.gate.done < cfg.trigger_share * len(specs):
        time.sleep(0.05)
    times.injected = time.monotonic()
    for name in ROLL:
        _replace(cluster, ctx, name, None)
        log.info(
            "fault=rolling-upgrade host=%s upgraded_at_s=%s",
            name,
            times.since_start(time.monotonic()),
        )
    times.healed = time.monotonic()
    if not load.is_alive():
        ctx.problems.append("the requests had ended before the last node was upgraded")
    load.gate.stop()
    outcomes = load.result()
    times.ended = time.monotonic()
    audit = wait_clean(cluster, cfg.audit_s)
    times.heal_s = round(time.monotonic() - times.healed, 2) if audit.clean else None
    row = fault_row(UPGRADE, outcomes, answers, cfg, audit, times, ctx)
    row.notes.append(f"{len(outcomes) / max(row.took_s, 1e-9):.2f} requests/s")
    _retry(cluster, cycled, answers, cfg, row)
    return row


def _onto(cluster: ChaosCluster, ctx: Injector, tree: Path) -> None:
    """Every process stopped, then all started on `tree` at once (no requests run yet)."""
    for name in ROLL:
        _drain(cluster, ctx, name)
        cluster.trees[name] = tree
    for name in NODES:
        cluster.start_node(name, wait=False)
    cluster.start_router(wait=False)
    for name in NODES:
        cluster.wait_node(name)
        ctx.notes.append(f"{name} protocol_version={cluster.stats(name).info.protocol_version}")
    cluster.wait_router()
    ctx.notes.append(f"router from {tree.name}")


def _replace(cluster: ChaosCluster, ctx: Injector, name: str, tree: Path | None) -> None:
    """Drain host `name`'s process, then start it on `tree` (None: this tree) and wait until
    the router routes to every node again."""
    began = time.monotonic()
    _drain(cluster, ctx, name)
    drained = time.monotonic()
    if tree is None:
        cluster.trees.pop(name, None)
    else:
        cluster.trees[name] = tree
    if name == "router":
        cluster.start_router(wait=False)
        what = f"router from {tree.name if tree else 'this tree'}"
    else:
        cluster.start_node(name, wait=True)
        what = f"{name} protocol_version={cluster.stats(name).info.protocol_version}"
    started = time.monotonic()
    _wait_routed(cluster, ctx, name)
    now = time.monotonic()
    ctx.notes.append(f"{what}: drain {drained - began:.1f} s, start {started - drained:.1f} s, "
                     f"routed again {now - started:.1f} s")  # fmt: skip


def _wait_routed(cluster: ChaosCluster, ctx: Injector, name: str) -> None:
    """Until the router routes to every node (a problem after TRIGGER_WAIT_S)."""
    deadline = time.monotonic() + TRIGGER_WAIT_S
    while not _routes_all(cluster) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not _routes_all(cluster):
        ctx.problems.append(f"the router did not route to every node {TRIGGER_WAIT_S:.0f}s "
                            f"after {name} started again")  # fmt: skip


def _routes_all(cluster: ChaosCluster) -> bool:
    try:
        return cluster.router_knows_all()
    except httpx.HTTPError:  # a router starting
        return False


def _drain(cluster: ChaosCluster, ctx: Injector, name: str) -> None:
    for pid in cluster.net.pids(name):
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + DRAIN_WAIT_S
    while cluster.net.pids(name) and time.monotonic() < deadline:
        time.sleep(0.1)
    if cluster.net.pids(name):
        ctx.problems.append(f"{name} still ran {DRAIN_WAIT_S:.0f}s after SIGTERM")
        cluster.net.kill_host(name)
    cluster.net.reap()


def _retry(
    cluster: ChaosCluster,
    specs: Sequence[Spec],
    expected: Sequence[Outcome],
    cfg: RunConfig,
    row: FaultRow,
) -> None:
    """Send each clearly failed request again; its answer must be identical."""
    failed = [specs[v["request"]] for v in row.not_identical if v["kind"] == "failed_clearly"]
    if not failed:
        return
    again = asyncio.run(run_all(cluster.router_url, failed, cfg.concurrency, cfg.deadline_s))
    verdicts = [judge(o, expected[o.index], cfg.deadline_s) for o in again]
    wrong = [v for v in verdicts if v.kind not in ("identical", "tie")]
    row.notes.append(f"retried {len(failed)} clearly failed: {len(failed) - len(wrong)} identical")
    row.problems += [f"request {v.index} retried: {v.kind} ({v.why})" for v in wrong]
