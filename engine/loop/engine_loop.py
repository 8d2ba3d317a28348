"""EngineLoop: one thread owns an LLMEngine; asyncio code reaches it through commands.

HTTP handlers never touch the engine. They send commands (callables taking the engine)
through a thread-safe queue; the thread runs every queued command between two steps, then
one step, and hands each request's outputs to that request's asyncio queue with
`call_soon_threadsafe`. With no request to run, the thread hands the KV tiers' pending
copies to their copier (the blocks a finished request left are written behind at once) and
sleeps on the command queue, so an idle node spends no CPU; while copies are under way it
wakes every TIER_POLL_S to refresh the snapshot's counters.

    loop = EngineLoop(engine, torch_threads=1)
    loop.start()
    stream = await loop.open("r1", lambda e: e.add_request("r1", ids, params))
    while not (item := await stream.get(timeout_s=30)).output.finished: ...
    await loop.abort("r1")
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from engine.config import EngineConfig
from engine.engine import EngineCounters, EngineStats, LLMEngine
from engine.loop.commands import Command, Job
from engine.loop.stream import EngineFailed, OutputSink, RequestStream, StreamOutput
from engine.outputs import RequestOutput
from engine.scheduler.request import FinishReason, RequestStatus

log = logging.getLogger("splitserve.engine.loop.engine_loop")

T = TypeVar("T")

TIER_POLL_S = 0.05  # an idle loop's snapshot lags the KV tiers' copies by at most this


@dataclass(frozen=True)
class LoopSnapshot:
    """The engine's numbers after the loop's latest iteration; safe to read from any thread."""

    stats: EngineStats
    counters: EngineCounters
    prefix_query_tokens: int = 0  # tokens looked up in the prefix cache, in total
    lora: dict[str, float] | None = None  # LoRA totals (engine.lora.manager.LoraStats.flat)


_STOP = object()


def _build_into(config: EngineConfig, built: cf.Future[LLMEngine]) -> None:
    try:
        built.set_result(LLMEngine(config))
    except BaseException as exc:  # the launcher's await raises it
        built.set_exception(exc)


class EngineLoop:
    """Runs an LLMEngine in a dedicated thread. Async methods are called from one event loop
    thread; `post` and `snapshot` from any thread."""

    def __init__(
        self, engine: LLMEngine, torch_threads: int | None = None, name: str = "engine-loop"
    ) -> None:
        if torch_threads is not None and torch_threads < 1:
            raise ValueError(f"torch_threads must be >= 1, got {torch_threads!r}")
        self.engine = engine  # read-only outside the thread: config, layout, KV tensor
        self._torch_threads = torch_threads
        self._commands: queue.SimpleQueue[Job | object] = queue.SimpleQueue()
        self._sinks: dict[str, OutputSink] = {}  # engine thread only
        self._unscheduled: set[str] = set()  # engine thread only: opened, never scheduled
        self._scheduled_at: dict[str, float] = {}  # engine thread only
        self._lock = threading.Lock()
        self._closed = False
        self._failure: str | None = None  # why the loop stopped by itself
        self._step_started: float | None = None  # monotonic start of the step under way
        self._snapshot = LoopSnapshot(engine.stats(), dataclasses.replace(engine.counters))
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # ---- lifecycle ----------------------------------------------------------------------

    @classmethod
    async def launch(cls, config: EngineConfig, torch_threads: int | None = None) -> EngineLoop:
        """Build the engine (loads the model) off the event loop, then start its thread.

        The engine is built in a thread of its own that ends once it is built, not in the
        event loop's executor, whose threads live on: an OpenMP runtime keeps a worker pool
        per thread that ran a parallel region, and with more pooled threads than cores
        (libgomp) every pool stops spinning between regions and sleeps, so each of a step's
        hundreds of parallel kernels pays a wake-up (a batch-1 decode step took 2x as long)."""
        if torch_threads is not None:
            torch.set_num_threads(torch_threads)
        built: cf.Future[LLMEngine] = cf.Future()
        builder = threading.Thread(
            target=_build_into, args=(config, built), name="engine-build", daemon=True
        )
        builder.start()
        engine = await asyncio.wrap_future(built)
        await asyncio.to_thread(builder.join)  # its OpenMP pool goes with it
        loop = cls(engine, torch_threads)
        loop.start()
        return loop

    def start(self) -> None:
        if self.engine.ranks is not None:  # a dead tensor-parallel rank stops the loop
            self.engine.ranks.on_failure.append(self._stop_on_failure)
        self._thread.start()

    def _stop_on_failure(self, message: str) -> None:
        self._failure = message
        with self._lock:
            if not self._closed:
                self._commands.put(_STOP)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Finish the current step, fail the open streams, end the thread. Idempotent."""
        with self._lock:
            if not self._closed:
                self._commands.put(_STOP)
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._closed

    def stalled_for(self) -> float:
        """Seconds the step under way has run (0 between steps); inf once the loop stopped.
        Thread safe: the streams' keepalives stop when a step hangs."""
        if not self.running:
            return float("inf")
        started = self._step_started
        return 0.0 if started is None else time.monotonic() - started

    @property
    def snapshot(self) -> LoopSnapshot:
        return self._snapshot

    # ---- commands -----------------------------------------------------------------------

    def post(self, command: Command) -> None:
        """Run `command(engine)` between steps; returns at once. Thread safe. Dropped (with
        a log line) when the loop has stopped."""
        if not self._put(Job(command, None)):
            log.warning("engine loop stopped; command dropped")

    async def call(self, command: Callable[[LLMEngine], T]) -> T:
        """Run `command(engine)` between steps and return its result (or raise its error).

        Cancelling the caller before the command runs skips it; once it ran, its effects
        stay (callers undo them with another command).
        """
        future: cf.Future[T] = cf.Future()
        if not self._put(Job(command, future)):
            raise EngineFailed("the engine loop is not running")
        return await asyncio.wrap_future(future)

    async def open(self, request_id: str, start: Command) -> RequestStream:
        """Run `start(engine)` (add_request, commit_import...) and route the request's outputs
        to a new stream, atomically. Errors of `start` propagate (ValueError: bad request)."""
        sink = OutputSink(asyncio.get_running_loop(), asyncio.Queue())

        def attach(engine: LLMEngine) -> None:
            if request_id in self._sinks:
                raise ValueError(f"request id {request_id!r} is already in use")
            start(engine)
            self._sinks[request_id] = sink
            if engine.scheduler.get(request_id) is None:  # finished at admission
                self._end(request_id, None)
            else:
                self._unscheduled.add(request_id)

        def undo(engine: LLMEngine) -> None:
            if self._sinks.get(request_id) is sink:
                self._abort_now(engine, request_id)

        try:
            await self.call(attach)
        except asyncio.CancelledError:
            self.post(undo)
            raise
        return RequestStream(request_id, sink.items)

    async def abort(self, request_id: str) -> bool:
        """Abort a request in any state; its stream ends with finish_reason ABORT.
        False when the engine did not know it."""
        return await self.call(lambda engine: self._abort_now(engine, request_id))

    def post_abort(self, request_id: str) -> None:
        """`abort` without waiting: for cleanup paths that may not await (thread safe)."""
        self.post(lambda engine: self._abort_now(engine, request_id))

    # ---- the thread ---------------------------------------------------------------------

    def _put(self, job: Job) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._commands.put(job)
            return True

    def _run(self) -> None:
        if self._torch_threads is not None:
            torch.set_num_threads(self._torch_threads)
        try:
            while self._run_commands(self._idle_wait()):
                if self.engine.has_unfinished():
                    self._step()
        finally:
            self._shut_down()

    def _idle_wait(self) -> float | None:
        """Seconds to wait for a command: 0 with work to step, else None (until one comes)
        or TIER_POLL_S while the KV tiers' copies run."""
        if self.engine.has_unfinished():
            return 0.0
        copying = self.engine.sync_tiers()
        self._refresh()
        return TIER_POLL_S if copying else None

    def _run_commands(self, wait_s: float | None) -> bool:
        """Run the queued commands, waiting up to `wait_s` for one (None: until one comes);
        False on stop."""
        try:
            first = self._commands.get(block=wait_s != 0, timeout=wait_s or None)
        except queue.Empty:
            return True
        pending = [first]
        for _ in range(self._commands.qsize()):
            pending.append(self._commands.get_nowait())
        for job in pending:
            if job is _STOP:
                return False
            if isinstance(job, Job):
                job.run(self.engine, self._refresh)
        return True

    def _refresh(self) -> None:
        self._snapshot = LoopSnapshot(
            self.engine.stats(),
            dataclasses.replace(self.engine.counters),
            self.engine.block_manager.num_prefix_query_tokens,
            stats.flat() if (stats := self.engine.lora_stats) is not None else None,
        )

    def _step(self) -> None:
        """One engine step; the snapshot is refreshed before its outputs go out."""
        started = self._step_started = time.monotonic()
        try:
            outputs = self.engine.step()
        except Exception as exc:
            self._step_started = None
            log.exception("engine step failed; aborting its %d requests", len(self._sinks))
            self._fail_all(f"engine step failed: {type(exc).__name__}: {exc}")
            self._refresh()
            return
        self._step_started = None
        self._refresh()
        self._note_scheduled(started)
        for out in outputs:
            self._deliver(out)

    def _note_scheduled(self, step_started: float) -> None:
        """Stamp the requests that left the waiting queue in the step begun at `step_started`."""
        for request_id in list(self._unscheduled):
            request = self.engine.scheduler.get(request_id)
            if request is None or request.status is not RequestStatus.WAITING:
                self._unscheduled.discard(request_id)  # gone: finished in this step
                self._scheduled_at[request_id] = step_started

    def _deliver(self, out: RequestOutput) -> None:
        pinned: tuple[int, ...] = ()
        if out.finish_reason is FinishReason.PREFILLED:
            pinned = tuple(self.engine.pinned_blocks(out.request_id))
        sink = self._sinks.get(out.request_id)
        if sink is None:
            return
        scheduled_at = self._scheduled_at.get(out.request_id)
        if out.finished:
            del self._sinks[out.request_id]
            self._scheduled_at.pop(out.request_id, None)
        sink.put(StreamOutput(out, pinned, scheduled_at))

    def _abort_now(self, engine: LLMEngine, request_id: str) -> bool:
        found = engine.abort(request_id)
        self._end(request_id, FinishReason.ABORT)
        return found

    def _end(self, request_id: str, reason: FinishReason | None) -> None:
        """Close a request's stream with a final output that carries no token."""
        sink = self._sinks.pop(request_id, None)
        self._unscheduled.discard(request_id)
        self._scheduled_at.pop(request_id, None)
        if sink is not None:
            sink.put(StreamOutput(RequestOutput(request_id, (), (), True, reason, 0, 0)))

    def _fail_all(self, message: str) -> None:
        for request_id, sink in list(self._sinks.items()):
            try:
                self.engine.abort(request_id)
            except Exception:
                log.exception("abort of %s failed", request_id)
            sink.put(EngineFailed(message))
        self._sinks.clear()
        self._unscheduled.clear()
        self._scheduled_at.clear()

    def _shut_down(self) -> None:
        with self._lock:
            self._closed = True
        while True:
            try:
                job = self._commands.get_nowait()
            except queue.Empty:
                break
            future = job.future if isinstance(job, Job) else None
            if future is not None and future.set_running_or_notify_cancel():
                future.set_exception(EngineFailed("the engine loop stopped"))
        self._fail_all(self._failure or "the engine loop stopped")
        self.engine.close()  # the KV tiers' copies finish: disk files written
