"""Carries out the KV tiers' copy orders (engine.kv.tier_book) on two worker threads.

The host tier is one tensor ``[host_blocks, num_layers, 2, block_size, kv_heads, head_dim]``
(pinned on CUDA, so copies are DMA); the disk tier is engine.kv.disk_store. The engine
submits a step's orders after scheduling it and calls `wait` just before its forward, which
returns as soon as the orders that step depends on are done: its loads and swaps, and the
write-behind copies of the device blocks it reuses. Everything else runs behind the step.
On CUDA the worker copies on its own stream, after the work the compute stream had queued
when the orders were submitted.

The memory lane runs the orders in order and hands each file order (a write, a delete) to the
file lane when it reaches it, so a file order runs after every copy ordered before it, and a
step's loads never wait behind file writes. The host slot a write reads stays pinned in the
tier book until `writes_done` counts it. `close` finishes both lanes within a deadline.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.cpu_kernels.threads import serial_torch_ops
from engine.kv.cache import KVLayout
from engine.kv.disk_store import DiskStore
from engine.kv.tier_book import CopyKind, CopyOrder

log = logging.getLogger("splitserve.engine.kv.copier")

WAIT_S = 120.0  # a forward waits this long for its copies at most, then fails
FLUSH_S = 5.0  # `close` waits this long for the queued file writes (inside the node's drain)


class KVLoadError(RuntimeError):
    """A load into the device cache failed (a block file went bad after the start): the
    block named by `order` holds garbage and must not be served."""

    def __init__(self, order: CopyOrder, cause: BaseException) -> None:
        super().__init__(f"a KV tier load ({order.kind.value}) failed: {cause}")
        self.order = order


@dataclass(frozen=True)
class Flushed:
    """What `close` did: file writes done while it waited, those left undone at its
    deadline, and the seconds it took."""

    written: int
    left: int
    seconds: float


class TierCopier:
    """The host tier's tensor, the disk store, and the threads that copy between them and
    the device cache `kv_cache`."""

    def __init__(
        self, kv_cache: torch.Tensor, layout: KVLayout, host_blocks: int, disk: DiskStore | None
    ) -> None:
        self.kv_cache = kv_cache
        self.layout = layout
        cuda = kv_cache.device.type == "cuda"
        # host: [host_blocks, num_layers, 2, block_size, kv_heads, head_dim]
        self.host = torch.empty(
            (host_blocks, *layout.block_shape), dtype=kv_cache.dtype, pin_memory=cuda
        )
        self.disk = disk
        self.bytes: Counter[str] = Counter()  # "host_in", "host_out", "disk_in", "disk_out"
        self.errors = 0  # write-behind copies that failed (logged); a failed load raises
        self._stream = torch.cuda.Stream(kv_cache.device) if cuda else None
        self._queue: queue.SimpleQueue[tuple[int, CopyOrder, torch.cuda.Event | None] | None]
        self._queue = queue.SimpleQueue()
        self._files: queue.SimpleQueue[CopyOrder | None] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._submitted = self._done = self._barrier = 0
        self._copies_submitted = self._copies_done = 0  # memory copies
        self._files_submitted = self._files_done = 0  # file orders
        self._writes_submitted = 0
        self.writes_done = 0  # file writes done (or failed) since the start, in order
        self._abandon = False  # past close's deadline: the file lane takes no more
        self._failed: KVLoadError | None = None
        self._last_save: dict[int, int] = {}  # device block -> seq of its latest copy out
        self.copy_bytes_per_s = self._measure()
        self._thread = threading.Thread(target=self._run, name="kv-tier-copier", daemon=True)
        self._file_thread = threading.Thread(
            target=self._run_files, name="kv-tier-files", daemon=True
        )
        self._thread.start()
        self._file_thread.start()

    @property
    def backlog(self) -> int:
        """Memory copies submitted and not done yet."""
        return self._copies_submitted - self._copies_done

    @property
    def disk_backlog(self) -> int:
        """File orders (writes, deletes) submitted and not done yet."""
        return self._files_submitted - self._files_done

    def submit(self, orders: list[CopyOrder], evicted: list[int]) -> None:
        """Queue a step's orders; `evicted`: device blocks it reuses (their copies out must
        finish before its forward)."""
        barrier = self._barrier
        event = None
        if self._stream is not None and orders:
            event = torch.cuda.Event()
            event.record()  # what the compute stream has queued so far comes first
        for order in orders:
            self._submitted += 1
            if order.kind is CopyKind.DEVICE_TO_HOST:
                self._last_save[order.block_id] = self._submitted
            if order.blocking:
                barrier = self._submitted
            if order.kind.on_file:
                self._files_submitted += 1
                self._writes_submitted += order.kind is CopyKind.HOST_TO_DISK
            else:
                self._copies_submitted += 1
            self._queue.put((self._submitted, order, event))
        # after the orders: a block saved and reused within one step waits for that save too
        for block_id in evicted:
            barrier = max(barrier, self._last_save.pop(block_id, 0))
        self._barrier = barrier
        if len(self._last_save) > 4 * self.kv_cache.shape[0]:
            done = self._done
            self._last_save = {b: s for b, s in self._last_save.items() if s > done}

    def wait(self, timeout_s: float = WAIT_S) -> None:
        """Until the orders the next forward depends on are done; raises a failed load."""
        self._wait_for(self._barrier, timeout_s)

    def flush(self, timeout_s: float = WAIT_S) -> None:
        """Until every submitted order is done (disk files written)."""
        seq, files = self._submitted, self._files_submitted
        self._wait_until(lambda: self._done >= seq and self._files_done >= files, timeout_s)

    def close(self, timeout_s: float = FLUSH_S) -> Flushed:
        """Finish the queued orders within `timeout_s` and stop the threads; file writes
        still queued then are left undone (a write cut short leaves only a temporary file,
        which the next start deletes)."""
        start, before = time.monotonic(), self.writes_done
        self._queue.put(None)
        self._thread.join(timeout_s)
        self._file_thread.join(max(0.0, start + timeout_s - time.monotonic()))
        self._abandon = self._file_thread.is_alive()
        left = self._writes_submitted - self.writes_done
        return Flushed(self.writes_done - before, left, time.monotonic() - start)

    def _wait_for(self, seq: int, timeout_s: float) -> None:
        self._wait_until(lambda: self._done >= seq, timeout_s)

    def _wait_until(self, done: Callable[[], bool], timeout_s: float) -> None:
        with self._cond:
            ok = self._cond.wait_for(lambda: done() or self._failed is not None, timeout_s)
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed
        if not ok:
            raise TimeoutError(f"KV tier copies not done after {timeout_s} s")

    def _run(self) -> None:
        """The memory lane: copies in order; file orders handed to the file lane."""
        serial_torch_ops()  # no OpenMP pool beside the engine's (engine.cpu_kernels.threads)
        while (item := self._queue.get()) is not None:
            seq, order, event = item
            failed = False
            if order.kind.on_file:
                self._files.put(order)  # every copy before it is done
            else:
                failed = self._attempt(order, event)
            with self._cond:
                self._done = seq
                self._copies_done += not order.kind.on_file
                self.errors += failed
                self._cond.notify_all()
        self._files.put(None)

    def _run_files(self) -> None:
        """The file lane: writes and deletes in order, until `close` gives up on them."""
        while not self._abandon and (order := self._files.get()) is not None:
            failed = self._attempt(order, None)
            with self._cond:
                self._files_done += 1
                self.writes_done += order.kind is CopyKind.HOST_TO_DISK
                self.errors += failed
                self._cond.notify_all()

    def _attempt(self, order: CopyOrder, event: torch.cuda.Event | None) -> bool:
        """Run one order; True when a write-behind order failed (logged). A failed load is
        kept for the step that waits for it."""
        try:
            self._execute(order, event)
        except Exception as exc:
            if order.blocking:
                self._failed = KVLoadError(order, exc)
                return False
            log.warning("kv_tier_copy_failed kind=%s error=%s", order.kind.value, exc)
            return True
        return False

    def _execute(self, order: CopyOrder, event: torch.cuda.Event | None) -> None:
        if self._stream is None or order.kind.on_file:
            self._copy(order)
            return
        with torch.cuda.stream(self._stream):
            if event is not None:
                self._stream.wait_event(event)
            self._copy(order)
            self._stream.synchronize()

    def _copy(self, order: CopyOrder) -> None:
        kind, size = order.kind, self.layout.block_bytes
        async_ = self._stream is not None
        if kind is CopyKind.DEVICE_TO_HOST:
            self.host[order.slot].copy_(self.kv_cache[order.block_id], non_blocking=async_)
            self.bytes["host_in"] += size
        elif kind is CopyKind.HOST_TO_DEVICE:
            self.kv_cache[order.block_id].copy_(self.host[order.slot], non_blocking=async_)
            self.bytes["host_out"] += size
        else:
            assert self.disk is not None and order.entry is not None
            if kind is CopyKind.HOST_TO_DISK:
                self.disk.write(order.entry, self.host[order.slot])
                self.bytes["disk_in"] += size
            elif kind is CopyKind.DISK_TO_DEVICE:
                block = self.disk.read(order.entry)
                self.kv_cache[order.block_id].copy_(block)
                self.bytes["disk_out"] += size
            else:
                self.disk.delete(order.entry)

    def _measure(self) -> float:
        """Bytes per second of a device -> host -> device round of a few blocks (the swap
        rule's copy rate)."""
        n = min(64, self.host.shape[0], self.kv_cache.shape[0])
        best = float("inf")
        for _ in range(3):  # the first touches the host pages: the best of the others counts
            start = time.perf_counter()
            self.host[:n].copy_(self.kv_cache[:n])
            self.kv_cache[:n].copy_(self.host[:n])
            if self._stream is not None:
                torch.cuda.synchronize(self.kv_cache.device)
            best = min(best, time.perf_counter() - start)
        return 2 * n * self.layout.block_bytes / max(best, 1e-9)
