"""The readers' side of KV events (cluster.kv_events): follow the streams of a set of nodes
and hand every message, in order, to a sink (the router's prefix index).

A node seen for the first time is read from its latest snapshot (or from the stream's start
when it has none yet). A jump in a node's `seq` means messages were lost (trimmed, or Redis
restarted): the reader starts again from a newer snapshot when there is one, else it goes on
and the node's next snapshot repairs the view. A node that leaves the set is dropped from the
sink. Redis outages are survived: the sink keeps what it knew.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from cluster.kv_events import FIELD, KVEventMsg, snapshot_key, stream_key
from cluster.registry import DEFAULT_NAMESPACE, REDIS_ERRORS, connect

log = logging.getLogger("splitserve.kv_events")


class KVEventSink(Protocol):
    def apply(self, msg: KVEventMsg) -> None:
        """Apply one message of a node, in stream order."""
        ...

    def drop(self, node_id: str) -> None:
        """Forget everything about a node."""
        ...


@dataclass
class _Cursor:
    entry: bytes  # last stream id read (exclusive start of the next read)
    incarnation: str = ""
    seq: int = 0
    snapshot_entry: bytes = b""  # stream id of the last snapshot applied


def entry_before(entry: bytes) -> bytes:
    """The stream id just before `entry`, so that XREAD from it returns `entry` first."""
    ms, seq = (int(part) for part in entry.split(b"-"))
    if seq > 0:
        return f"{ms}-{seq - 1}".encode()
    return f"{ms - 1}-{(1 << 64) - 1}".encode() if ms > 0 else b"0"


class KVEventReader:
    """Reads the KV event streams of the nodes `nodes()` names, every `block_s` at most."""

    def __init__(
        self,
        redis_url: str,
        sink: KVEventSink,
        nodes: Callable[[], Iterable[str]],
        *,
        block_s: float = 0.5,
        namespace: str = DEFAULT_NAMESPACE,
        on_lag: Callable[[float], None] | None = None,
    ) -> None:
        if not 0 < block_s < 1.0:
            raise ValueError(f"block_s must be in (0, 1) (the client's socket timeout), {block_s}")
        self._redis = connect(redis_url, timeout_s=block_s + 1.0)
        self._sink, self._nodes, self._block_ms = sink, nodes, int(block_s * 1000)
        self._namespace = namespace
        self._on_lag = on_lag
        self._cursors: dict[str, _Cursor] = {}
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.redis_ok = False
        self.lost = 0  # gaps seen, in total

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="kv-event-reader")

    async def stop(self) -> None:
        if self._task is not None:
            self._stop.set()  # not a cancel: see NodeRegistry.run_heartbeats
            done, _ = await asyncio.wait({self._task}, timeout=self._block_ms / 1000 + 5.0)
            if not done:
                self._task.cancel()
            self._task = None
        await self._redis.aclose()

    async def poll(self) -> int:
        """One round: follow membership changes, read what is new. Returns messages applied;
        raises on Redis errors."""
        await self._follow(set(self._nodes()))
        if not self._cursors:
            await asyncio.sleep(self._block_ms / 1000)
            return 0
        streams = {stream_key(n, self._namespace): c.entry for n, c in self._cursors.items()}
        reply = await self._redis.xread(streams, count=1000, block=self._block_ms)  # type: ignore[arg-type]
        applied = 0
        for node_id, entries in _by_node(reply):
            cursor = self._cursors.get(node_id)
            if cursor is None:
                continue
            for entry, fields in entries:
                outcome = await self._apply(node_id, cursor, entry, fields)
                if outcome is None:
                    break  # resynced: the rest comes again from the snapshot on
                applied += outcome
        return applied

    async def _loop(self) -> None:
        down = False
        while not self._stop.is_set():
            try:
                await self.poll()
                self.redis_ok = True
                if down:
                    log.info("kv_events_reachable nodes=%d", len(self._cursors))
                down = False
            except REDIS_ERRORS as exc:
                if not down:
                    log.warning("kv_events_unreachable keeping_index=true error=%s", exc)
                down, self.redis_ok = True, False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self._block_ms / 1000)

    async def _follow(self, wanted: set[str]) -> None:
        for node_id in set(self._cursors) - wanted:
            del self._cursors[node_id]
            self._sink.drop(node_id)
        for node_id in wanted - set(self._cursors):
            self._cursors[node_id] = _Cursor(await self._start_of(node_id) or b"0")

    async def _start_of(self, node_id: str) -> bytes | None:
        """Just before the node's latest snapshot; None when it has published none."""
        pointer = _bytes(await self._redis.get(snapshot_key(node_id, self._namespace)))
        return entry_before(pointer) if pointer else None

    async def _apply(
        self, node_id: str, cursor: _Cursor, entry: bytes, fields: dict[bytes, bytes]
    ) -> int | None:
        """1 if applied, 0 if skipped, None if the reader went back to a snapshot."""
        cursor.entry = entry
        try:
            msg = KVEventMsg.model_validate_json(fields[FIELD])
        except (KeyError, ValidationError):
            log.warning("bad_kv_event node=%s entry=%s", node_id, entry.decode())
            return 0
        same_run = msg.incarnation == cursor.incarnation
        if same_run and msg.seq <= cursor.seq:
            return 0  # read twice after a resync
        if same_run and msg.seq != cursor.seq + 1 and not msg.snapshot:
            self.lost += 1
            log.info("kv_events_gap node=%s after=%d got=%d", node_id, cursor.seq, msg.seq)
            if await self._resync(node_id, cursor):
                return None
        cursor.incarnation, cursor.seq = msg.incarnation, msg.seq
        if msg.snapshot:
            cursor.snapshot_entry = entry
        self._sink.apply(msg)
        if self._on_lag is not None and msg.sent_at:
            self._on_lag(max(time.time() - msg.sent_at, 0.0))
        return 1

    async def _resync(self, node_id: str, cursor: _Cursor) -> bool:
        """Restart from a snapshot newer than the last one applied; False when there is none
        (then the gap stays until the node's next snapshot)."""
        pointer = _bytes(await self._redis.get(snapshot_key(node_id, self._namespace)))
        if not pointer or pointer == cursor.snapshot_entry:
            return False
        cursor.entry, cursor.incarnation, cursor.seq = entry_before(pointer), "", 0
        return True


Entries = list[tuple[bytes, dict[bytes, bytes]]]


def _by_node(reply: Any) -> list[tuple[str, Entries]]:
    """XREAD's reply as (node id, entries) pairs."""
    return [(bytes(key).decode().rsplit(":", 1)[-1], list(entries)) for key, entries in reply or []]


def _bytes(value: Any) -> bytes | None:
    return value.encode() if isinstance(value, str) else value
