"""The faults a chaos run injects while its requests stream, and how each one heals.

Each fault waits for its moment (a KV lease held on the prefill host, tokens streaming on
the decode host), injects, holds `hold_s`, then heals. The KV path faults (delay, loss) stay
on from the first request to the last. A host kill SIGKILLs every process in the host's
namespace; the host comes back (its node started again) when the fault heals. A restart
kills the node and starts it again at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import httpx

from bench.chaos.cluster import DECODE, NODES, PREFILL, ChaosCluster
from bench.chaos.impair import Impairment

TRIGGER_WAIT_S = 30.0
TRIGGER_POLL_S = 0.02
HOLD_S = 10.0


@dataclass
class Injector:
    """What a fault acts on: the cluster and the impairment it put on the wire, if any."""

    cluster: ChaosCluster
    impairment: Impairment | None = None
    notes: list[str] = field(default_factory=list)  # what happened
    problems: list[str] = field(default_factory=list)  # what should not have

    def impair(self, paths: Mapping[str, Sequence[str]], loss: float, delay_ms: float) -> None:
        self.clear()
        impairment = Impairment(self.cluster.net, paths, loss=loss, delay_ms=delay_ms)
        self.impairment = impairment.start()

    def clear(self) -> None:
        if self.impairment is not None:
            self.notes.append(f"link: {self.impairment.stop()}")
            self.impairment = None


Action = Callable[[Injector], None]
Trigger = Callable[[ChaosCluster], bool]


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    inject: Action
    heal: Action
    trigger: Trigger | None = None  # None: inject at once
    hold_s: float = HOLD_S
    whole_run: bool = False  # on before the first request, off after the last
    kills: str | None = None  # the node a host kill or restart takes down
    control: bool = False  # no fault at all


def _both_ways(pairs: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    paths: dict[str, list[str]] = {}
    for a, b in pairs:
        paths.setdefault(a, []).append(b)
        paths.setdefault(b, []).append(a)
    return paths


def _cut(pairs: Sequence[tuple[str, str]]) -> Action:
    return lambda ctx: ctx.impair(_both_ways(pairs), loss=1.0, delay_ms=0.0)


def _kv_path(loss: float, delay_ms: float) -> Action:
    """Frames from each prefill host to each decode host (the KV reads' data)."""
    return lambda ctx: ctx.impair({p: list(DECODE) for p in PREFILL}, loss, delay_ms)


def _clear(ctx: Injector) -> None:
    ctx.clear()


def _kill(name: str) -> Action:
    def kill(ctx: Injector) -> None:
        pids = ctx.cluster.net.kill_host(name)
        ctx.notes.append(f"killed {name}: {len(pids)} processes")

    return kill


def _restart(name: str) -> Action:
    def restart(ctx: Injector) -> None:
        _kill(name)(ctx)
        ctx.cluster.start_node(name, wait=False)

    return restart


def _back(name: str) -> Action:
    """The node runs again (started now unless it is starting) and the router knows it."""

    def back(ctx: Injector) -> None:
        cluster = ctx.cluster
        if not cluster.started(name):  # (a node started a moment ago may not be in its host yet)
            cluster.start_node(name, wait=False)
        cluster.wait_node(name)
        deadline = time.monotonic() + TRIGGER_WAIT_S
        while not cluster.router_knows_all() and time.monotonic() < deadline:
            time.sleep(0.1)

    return back


def _leased(name: str) -> Trigger:
    return lambda cluster: cluster.stats(name).load.leases_held > 0


def _decoding(name: str, streams: int = 2) -> Trigger:
    return lambda cluster: cluster.stats(name).load.running >= streams


P0, D0 = PREFILL[0], DECODE[0]
NODE_LINKS = [(n, "redis") for n in NODES]
ROUTER_LINK = [("router", "redis")]
_ALL = (
    Fault("none", "no fault: the control run", _clear, _clear, control=True),
    Fault(
        "partition",
        f"{P0} and {D0} cut apart (every frame dropped) for 10 s while {P0} holds a lease",
        _cut([(P0, D0)]), _clear, _leased(P0),
    ),
    Fault(
        "kv-delay-20ms",
        "20 ms more on every frame from a prefill host to a decode host",
        _kv_path(0.0, 20.0), _clear, whole_run=True,
    ),
    Fault(
        "kv-loss-1pct",
        "1% of the frames from the prefill hosts to the decode hosts lost",
        _kv_path(0.01, 0.0), _clear, whole_run=True,
    ),
    Fault(
        "prefill-host-kill",
        f"every process of host {P0} SIGKILLed while it holds a lease; back 10 s later",
        _kill(P0), _back(P0), _leased(P0), kills=P0,
    ),
    Fault(
        "decode-host-kill",
        f"every process of host {D0} SIGKILLed while it streams 2 or more; back 10 s later",
        _kill(D0), _back(D0), _decoding(D0), kills=D0,
    ),
    Fault("redis-router", "Redis cut off from the router for 10 s", _cut(ROUTER_LINK), _clear),
    Fault("redis-nodes", "Redis cut off from every node for 10 s", _cut(NODE_LINKS), _clear),
    Fault(
        "decode-restart",
        f"{D0} killed and started again at once while prefill nodes hold leases",
        _restart(D0), _back(D0), _leased(P0), hold_s=0.0, kills=D0,
    ),
    Fault(
        "prefill-restart",
        f"{P0} killed and started again at once while decode nodes read from it",
        _restart(P0), _back(P0), _leased(P0), hold_s=0.0, kills=P0,
    ),
)  # fmt: skip
FAULTS: dict[str, Fault] = {f.name: f for f in _ALL}
HOST_KILLS = frozenset({"prefill-host-kill", "decode-host-kill"})


def wait_trigger(
    cluster: ChaosCluster, trigger: Trigger | None, running: Callable[[], bool]
) -> str:
    """Until `trigger` holds (or the requests end, or TRIGGER_WAIT_S): '' or why not."""
    if trigger is None:
        return ""
    deadline = time.monotonic() + TRIGGER_WAIT_S
    while running() and time.monotonic() < deadline:
        try:
            if trigger(cluster):
                return ""
        except (httpx.HTTPError, OSError):
            pass
        time.sleep(TRIGGER_POLL_S)
    return "the trigger did not fire: injected anyway"
