"""The interface both transports implement, and the result of one READ."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple, Protocol

from kv_transfer.deadline import Deadline
from kv_transfer.head_plan import HeadPlan
from kv_transfer.peer_info import PeerInfo, TransportKind

if TYPE_CHECKING:
    from kv_transfer.shards import KVShards

RELEASE_PREFIX = b"splitserve-release:"


Facts = Mapping[str, str | int | float]


class TransferResult(NamedTuple):
    """What one READ moved and how long it took: `seconds` from the call to completion
    (connection set-up included); `window_s` the READ as its caller waits for it, from
    handing it to the transport to having the blocks, less connection set-up (ReadWindow);
    over `pieces` reads; `retries`: stale connections replaced; `facts`: what the transport
    itself measured (span attributes: the wire time, NIXL's telemetry)."""

    nbytes: int
    seconds: float
    window_s: float = 0.0
    pieces: int = 0
    retries: int = 0
    facts: Facts = MappingProxyType({})

    @property
    def gbps(self) -> float:
        """Bandwidth over the window (GB/s)."""
        return self.nbytes / self.window_s / 1e9 if self.window_s > 0 else 0.0


@dataclass
class TransferCounters:
    """Reads by outcome, bytes moved, and release notices that failed after their READ
    completed (the owner's lease then ends at its expiry), for the node's metrics."""

    ok: int = 0
    failed: int = 0
    timed_out: int = 0
    bytes: int = 0
    release_failed: int = 0


class ReadWindow:
    """One READ's times (time.perf_counter()). The caller brackets it (`start`, `end`): the
    window it reports is what the caller waited, hand-offs to and from the transport's
    thread included, less the connection set-up the transport notes (`setup`: a first READ
    to a peer, a dead connection replaced). The transport's threads note when data was
    first asked for and last arrived (`post`, `complete`: the wire time, a fact of its own),
    in how many pieces, and how many stale connections it replaced. `trace`: the reader's
    W3C trace context (`traceparent`, `tracestate`), which the TCP READ message carries so
    that the serving side's span joins the reader's trace."""

    def __init__(self, trace: Mapping[str, str] | None = None) -> None:
        self.trace: dict[str, str] = dict(trace or {})
        self._lock = threading.Lock()
        self.started: float | None = None
        self.ended: float | None = None
        self.setup_s = 0.0
        self.posted: float | None = None
        self.completed: float | None = None
        self.pieces = 0
        self.retries = 0
        self.facts: Facts = {}

    @property
    def traced(self) -> bool:
        """Whether the READ's trace context is sampled (its span records attributes)."""
        flags = self.trace.get("traceparent", "").rsplit("-", 1)[-1]
        try:
            return bool(int(flags, 16) & 1)
        except ValueError:
            return False

    def note(self, facts: Facts) -> None:
        """What the transport library reported of the READ so far (replaces the last)."""
        with self._lock:
            self.facts = dict(facts)

    def start(self) -> None:
        """The caller hands the READ to the transport."""
        self.started = time.perf_counter()

    def end(self) -> None:
        """The caller has the blocks."""
        self.ended = time.perf_counter()

    def setup(self, seconds: float) -> None:
        """`seconds` went to connecting (not to moving the blocks)."""
        with self._lock:
            self.setup_s += seconds

    def post(self) -> None:
        """A piece was asked for (NIXL: posted; TCP: its READ message sent)."""
        with self._lock:
            now = time.perf_counter()
            self.posted = now if self.posted is None else min(self.posted, now)
            self.pieces += 1

    def complete(self) -> None:
        """A piece's last byte is in."""
        with self._lock:
            now = time.perf_counter()
            self.completed = now if self.completed is None else max(self.completed, now)

    def retried(self) -> None:
        with self._lock:
            self.retries += 1

    def seconds(self) -> float:
        """From `start` to `end`, less connection set-up; 0 until both are noted."""
        if self.started is None or self.ended is None:
            return 0.0
        return max(self.ended - self.started - self.setup_s, 0.0)

    def wire_seconds(self) -> float:
        """From the first post to the last byte in, as the transport's threads saw them."""
        if self.posted is None or self.completed is None:
            return 0.0
        return max(self.completed - self.posted, 0.0)


class Served(NamedTuple):
    """A READ this process served (owner side) for a reader that sent its trace context:
    `start` (READ message in) and `end` (last byte out) are time.monotonic() stamps."""

    request_id: str
    trace: dict[str, str]
    start: float
    end: float
    nbytes: int


ServedHook = Callable[[Served], None]  # called on the serving thread


def trace_of(body: Mapping[str, object]) -> dict[str, str]:
    """The trace context a READ message carries (empty when none, or not strings)."""
    trace = body.get("trace")
    if not isinstance(trace, dict):
        return {}
    return {k: v for k, v in trace.items() if isinstance(k, str) and isinstance(v, str)}


class Transport(Protocol):
    """Moves blocks of a registered KV region between processes.

    Validation (ids, layouts) happens before a transport is called. Owner side: readers'
    release notices are queued by the transport and collected with `take_releases`.
    Reader side: a READ returns once its blocks are in; the release notice that follows goes
    out after, off the caller's path, and a failure to send it counts in `counters`.
    """

    kind: TransportKind
    counters: TransferCounters

    def describe(self) -> str:
        """One line for the log: the transport and its settings."""
        ...

    def peer_fields(self) -> dict[str, object]:
        """Transport-specific PeerInfo fields (NIXL metadata or TCP address)."""
        ...

    async def read(
        self,
        peer: PeerInfo,
        remote_ids: Sequence[int],
        local_ids: Sequence[int],
        request_id: str,
        deadline: Deadline,
        window: ReadWindow,
    ) -> int:
        """Copy the peer's `remote_ids` blocks into local `local_ids`, then tell the owner
        that `request_id` is done with them, noting post and completion in `window`.
        Returns bytes moved; raises TransferError."""
        ...

    async def read_heads(
        self,
        peer: PeerInfo,
        plan: HeadPlan,
        local: KVShards,
        ids: tuple[Sequence[int], Sequence[int]],
        request_id: str,
        deadline: Deadline,
        window: ReadWindow,
    ) -> int:
        """Like `read` for nodes that split the KV heads differently: each of `plan`'s reads
        moves its heads of the peer's blocks `ids[0]` into `local`'s rank's blocks `ids[1]`
        (the local copies of replicated heads are the caller's). Returns bytes moved."""
        ...

    async def release(self, peer: PeerInfo, request_id: str, deadline: Deadline) -> None:
        """Tell the owner that `request_id` is done with its blocks without reading any
        (the reader had them all cached). Raises TransferError."""
        ...

    async def connect(self, peer: PeerInfo, deadline: Deadline) -> None:
        """Open and cache the connection to `peer` now; raises TransferError."""
        ...

    def take_releases(self) -> list[str]:
        """Request ids that readers released since the last call (owner side)."""
        ...

    def on_served(self, hook: ServedHook) -> None:
        """Call `hook` for each READ served to a reader that sent its trace context (owner
        side; TCP only: a NIXL READ is one-sided, the owner's CPU never sees it)."""
        ...

    def forget(self, node_name: str) -> None:
        """Drop any cached connection to `node_name`."""
        ...

    def inflight(self) -> int:
        """READs of this process under way now."""
        ...

    def close(self) -> None: ...


class Settable(Protocol):
    """A future of either kind (concurrent.futures or asyncio)."""

    def done(self) -> bool: ...
    def set_result(self, result: None, /) -> None: ...
    def set_exception(self, exception: BaseException, /) -> None: ...


def settle(future: Settable, error: BaseException | None) -> None:
    """End `future` with None or `error`, unless it has ended already."""
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def release_message(request_id: str) -> bytes:
    return RELEASE_PREFIX + request_id.encode()


def parse_release(message: bytes) -> str | None:
    """The request id of a release notice, or None for any other message."""
    if not message.startswith(RELEASE_PREFIX):
        return None
    return message[len(RELEASE_PREFIX) :].decode(errors="replace")
