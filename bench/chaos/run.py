"""A chaos session: the hosts, the cluster, the fault-free answers, then one run of the same
requests per fault, each judged by the checker and followed by an audit.

One fault's run: the requests start (`concurrency` at a time); once `trigger_share` of them
have ended and the fault's trigger holds, the fault is injected, held and healed. Then new
requests wait until those in flight have ended and the cluster is clean again (within
`audit_s`, bench.chaos.audit): the time from the heal to that is the fault's heal time.
Then the rest run, and the cluster must be clean again after the last. The faults on the KV
path are on from the first request to the last.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from bench.chaos.audit import Audit, wait_clean
from bench.chaos.checker import check_baseline, judge, tally
from bench.chaos.client import Gate, Outcome, run_all
from bench.chaos.cluster import HOSTS, ChaosCluster, ClusterConfig, running
from bench.chaos.faults import HOST_KILLS, Fault, Injector, wait_trigger
from bench.chaos.netns import HostNet
from bench.chaos.workload import Spec
from bench.workloads import poisson_arrivals

log = logging.getLogger("bench.chaos")
ARRIVALS = ("poisson", "fixed")
BASELINE_CONCURRENCY = 6


@dataclass(frozen=True)
class RunConfig:
    requests: int = 60
    concurrency: int = 6
    deadline_s: float = 60.0  # each request's `timeout`
    audit_s: float = 60.0  # after the last answer, for the cluster to be clean
    trigger_share: float = 0.2  # of the requests ended before a fault may fire
    seed: int = 0
    rate: float | None = None  # requests/s offered under a fault (None: as fast as allowed)
    arrivals: str = "poisson"  # or "fixed": how the requests at `rate` are spaced

    def __post_init__(self) -> None:
        if self.requests < 1 or self.concurrency < 1:
            raise ValueError(f"requests and concurrency must be >= 1: {self}")
        if not 0 <= self.trigger_share < 1:
            raise ValueError(f"trigger_share must be in [0, 1), got {self.trigger_share}")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")
        if self.arrivals not in ARRIVALS:
            raise ValueError(f"arrivals must be one of {ARRIVALS}, got {self.arrivals!r}")

    def starts(self, count: int) -> list[float] | None:
        """Each of `count` requests' send time from the first (None: no rate)."""
        if self.rate is None:
            return None
        if self.arrivals == "fixed":
            return [i / self.rate for i in range(count)]
        return poisson_arrivals(count, self.rate, self.seed)


@dataclass
class FaultRow:
    """One fault's line of the table, and what explains it."""

    fault: str
    what: str
    requests: int
    identical: int
    tie: int  # identical up to a near-tie broken the other way (bench.chaos.checker)
    failed_clearly: int
    lost: int
    hung: int
    leaked_blocks: int
    clean: bool
    heal_s: float | None  # from the heal to every node back at its idle count
    drain_s: float  # from the last answer to the same (the run's final audit)
    ttft_p50_ms: float | None  # streamed requests
    ttft_p99_ms: float | None
    second_token_p50_ms: float | None  # from the request to its second token (after the KV read)
    second_token_p99_ms: float | None
    injected_at_s: float | None  # from the first request
    healed_at_s: float | None
    took_s: float  # from the first request to the last answer
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    not_identical: list[dict[str, Any]] = field(default_factory=list)

    def passes(self, failed_share: float | None) -> bool:
        """Lost, hung and leaked are 0; everything is identical (or a tie) or failed clearly;
        with a `failed_share`, fewer than that share failed."""
        ok = self.lost == self.hung == self.leaked_blocks == 0 and self.clean and not self.problems
        ok = ok and self.identical + self.tie + self.failed_clearly == self.requests
        return ok and (failed_share is None or self.failed_clearly < failed_share * self.requests)


@contextmanager
def session(config: ClusterConfig) -> Iterator[ChaosCluster]:
    """The hosts and the cluster on them; everything is removed on the way out."""
    with HostNet.make(HOSTS) as net, running(net, config) as cluster:
        yield cluster


def baseline(cluster: ChaosCluster, specs: Sequence[Spec], cfg: RunConfig) -> list[Outcome]:
    """The fault-free answers (every one must succeed), then a clean cluster; at most
    BASELINE_CONCURRENCY at a time (a rate run's cap, all at once, may pass deadlines)."""
    at_once = min(cfg.concurrency, BASELINE_CONCURRENCY)
    outcomes = asyncio.run(run_all(cluster.router_url, specs, at_once, cfg.deadline_s))
    check_baseline(outcomes)
    audit = wait_clean(cluster, cfg.audit_s)
    if not audit.clean:
        raise RuntimeError(f"not clean after the fault-free run: {audit.problems}")
    return outcomes


class Load(threading.Thread):
    """The requests, in a thread of their own (the fault is driven from the caller's)."""

    def __init__(self, cluster: ChaosCluster, specs: Sequence[Spec], cfg: RunConfig) -> None:
        super().__init__(name="chaos-load", daemon=True)
        self._args = (cluster.router_url, specs, cfg.concurrency, cfg.deadline_s)
        self._starts = cfg.starts(len(specs))
        self.gate = Gate()
        self.outcomes: list[Outcome] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.outcomes = asyncio.run(run_all(*self._args, self.gate, self._starts))
        except BaseException as exc:  # handed to the caller by result()
            self.error = exc

    def result(self) -> list[Outcome]:
        self.join()
        if self.error is not None:
            raise RuntimeError(f"the requests' thread failed: {self.error!r}") from self.error
        return self.outcomes

    def settle(self) -> None:
        """Until no request is in flight (new ones wait while the gate is closed)."""
        while self.is_alive() and self.gate.in_flight:
            time.sleep(0.05)


def run_fault(
    cluster: ChaosCluster,
    fault: Fault,
    specs: Sequence[Spec],
    expected: Sequence[Outcome],
    cfg: RunConfig,
) -> FaultRow:
    ctx = Injector(cluster)
    load = Load(cluster, specs, cfg)
    times = Times()
    if fault.whole_run:
        fault.inject(ctx)
    times.start = time.monotonic()
    load.start()
    try:
        if not fault.whole_run and not fault.control:
            _drive(cluster, fault, ctx, load, cfg, times)
        outcomes = load.result()
    finally:
        if fault.whole_run:
            fault.heal(ctx)
            times.healed = time.monotonic()
        ctx.clear()
    times.ended = time.monotonic()
    audit = wait_clean(cluster, cfg.audit_s)
    if fault.whole_run:
        times.injected, times.heal_s = times.start, _heal_s(times, audit)
    return fault_row(fault, outcomes, expected, cfg, audit, times, ctx)


@dataclass
class Times:
    """time.monotonic() of a fault run's moments, and how long it took to heal."""

    start: float = 0.0
    injected: float | None = None
    healed: float | None = None
    ended: float = 0.0  # the requests' thread ended
    heal_s: float | None = None  # from the heal to a clean cluster (None: not within audit_s)

    def since_start(self, moment: float | None) -> float | None:
        return None if moment is None else round(moment - self.start, 2)


def _heal_s(times: Times, audit: Audit) -> float | None:
    if times.healed is None or not audit.clean:
        return None
    return round(time.monotonic() - times.healed, 2)


def _drive(
    cluster: ChaosCluster, fault: Fault, ctx: Injector, load: Load, cfg: RunConfig, times: Times
) -> None:
    """Inject at the fault's moment, hold, heal; then hold new requests back until the
    cluster is clean (how long that takes after the heal is the fault's heal time)."""
    while load.is_alive() and load.gate.done < cfg.trigger_share * cfg.requests:
        time.sleep(0.05)
    missed = wait_trigger(cluster, fault.trigger, load.is_alive)
    if missed:
        ctx.notes.append(missed)
    times.injected = time.monotonic()
    if not load.is_alive():
        ctx.problems.append("every request had ended before the fault was injected")
    fault.inject(ctx)
    log.info("fault=%s injected_at_s=%s", fault.name, times.since_start(times.injected))
    time.sleep(fault.hold_s)
    if fault.kills is not None and fault.hold_s and fault.kills in cluster.registry():
        ctx.problems.append(f"the registry still lists {fault.kills} {fault.hold_s:.0f}s after")
    fault.heal(ctx)
    times.healed = time.monotonic()
    log.info("fault=%s healed_at_s=%s", fault.name, times.since_start(times.healed))
    load.gate.close()
    try:
        load.settle()
        audit = wait_clean(cluster, cfg.audit_s)
        times.heal_s = _heal_s(times, audit)
        if not audit.clean:
            ctx.problems += [f"{cfg.audit_s:.0f}s after the heal: {p}" for p in audit.problems]
    finally:
        load.gate.open()


def fault_row(
    fault: Fault,
    outcomes: list[Outcome],
    expected: Sequence[Outcome],
    cfg: RunConfig,
    audit: Audit,
    times: Times,
    ctx: Injector,
) -> FaultRow:
    verdicts = [judge(o, expected[o.index], cfg.deadline_s) for o in outcomes]
    counts = tally(verdicts)
    last_end = max(o.ended for o in outcomes)
    streamed = [o for o in outcomes if o.ttft_s is not None]
    ttfts = sorted(o.ttft_s * 1000 for o in streamed if o.ttft_s is not None)
    seconds = sorted(o.second_s * 1000 for o in streamed if o.second_s is not None)
    healed = times.healed
    return FaultRow(
        fault=fault.name,
        what=fault.what,
        requests=len(outcomes),
        identical=counts["identical"],
        tie=counts["tie"],
        failed_clearly=counts["failed_clearly"],
        lost=counts["lost"],
        hung=counts["hung"],
        leaked_blocks=audit.leaked_blocks,
        clean=audit.clean,
        heal_s=times.heal_s,
        drain_s=round(audit.took_s, 2),
        ttft_p50_ms=_pct(ttfts, 50),
        ttft_p99_ms=_pct(ttfts, 99),
        second_token_p50_ms=_pct(seconds, 50),
        second_token_p99_ms=_pct(seconds, 99),
        injected_at_s=times.since_start(times.injected),
        healed_at_s=times.since_start(healed),
        took_s=round(last_end - times.start, 2),
        problems=ctx.problems + audit.problems,
        notes=ctx.notes,
        not_identical=[
            {"request": v.index, "kind": v.kind, "why": v.why}
            for v in verdicts
            if v.kind != "identical"
        ],
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _pct(values: list[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 1)
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 1)


def failed_share_limit(fault: Fault) -> float | None:
    """The target on clear failures: under 5%, except for host kills."""
    return None if fault.name in HOST_KILLS else 0.05
