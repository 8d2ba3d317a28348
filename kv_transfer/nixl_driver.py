"""One thread that makes every NIXL call of a process and watches its transfers.

Why a thread: a READ over CMA copies inside `transfer()`, which would stall the caller's
event loop for the whole copy; and NIXL agents are not thread safe, so one thread makes all
calls. A transfer that `transfer()` did not finish moves on only while it is checked (the
reading agent has no progress thread: each check progresses UCX), so for its first 2 ms the
thread checks it without sleeping, yielding the GIL between checks; after that it sleeps on
its job queue between checks (50 us, doubling up to 1 ms). With nothing in flight it never
spins: it wakes every `notify_interval_s` to collect notifications (which also progresses
agents that have no progress thread of their own).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from kv_transfer.deadline import Deadline
from kv_transfer.errors import (
    PeerUnavailable,
    TransferCancelled,
    TransferError,
    TransferTimeout,
)
from kv_transfer.transport import settle

logger = logging.getLogger(__name__)

T = TypeVar("T")
_SPIN_S = 2e-3  # after posting, check without sleeping this long
_FIRST_WAIT_S = 50e-6  # then sleep between checks this long, doubling
_MAX_WAIT_S = 1e-3

OnFinish = Callable[[TransferError | None], None]
OnNotif = Callable[[str, bytes], None]
MakeHandle = Callable[[], tuple[Any, Any]]  # -> (agent, transfer handle)
OnDone = Callable[[Any, Any], None]  # (agent, handle) of a completed transfer


@dataclass
class _Inflight:
    agent: Any
    handle: Any
    future: cf.Future[None]
    on_finish: OnFinish
    deadline: Deadline
    next_check: float
    spin_until: float
    wait_s: float
    on_done: OnDone | None = None


class NixlDriver:
    """Runs jobs and watches transfers of nixl agents on one dedicated thread."""

    def __init__(self, name: str, notify_interval_s: float) -> None:
        self._notify_interval_s = notify_interval_s
        self._sources: list[tuple[Any, OnNotif]] = []  # touched only on the thread
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._inflight: list[_Inflight] = []
        self._thread = threading.Thread(target=self._run, name=f"nixl-{name}", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> cf.Future[T]:
        """Run `fn` on the driver thread."""
        future: cf.Future[T] = cf.Future()

        def job() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:
                    future.set_exception(exc)

        self._jobs.put(job)
        return future

    def call(self, fn: Callable[[], T]) -> T:
        return self.submit(fn).result()

    def watch_notifs(self, agent: Any, on_notif: OnNotif) -> None:
        """Collect `agent`'s notifications periodically (call on the thread)."""
        self._sources.append((agent, on_notif))

    def forget_agents(self) -> None:
        """Drop the references to watched agents (call on the thread)."""
        self._sources.clear()

    def transfer(
        self,
        make_handle: MakeHandle,
        deadline: Deadline,
        on_finish: OnFinish,
        on_done: OnDone | None = None,
    ) -> cf.Future[None]:
        """Create a transfer with `make_handle` (on the thread), post it, and watch it.

        The future ends with None or a TransferError. A transfer that completed is shown to
        `on_done(agent, handle)` (keep it short: the caller still waits), then its future
        resolves, then its handle is released and `on_finish(None)` runs (the release notice:
        off the caller's path). A failed one's handle is released (which cancels a request
        still in progress) and `on_finish(error)` runs before its future fails, so nothing
        writes any more once the caller sees the error. `on_finish` runs only if
        `make_handle` returned a handle."""
        future: cf.Future[None] = cf.Future()
        post = (make_handle, deadline, on_finish, future, on_done)
        self._jobs.put(lambda: self._post(*post))
        return future

    def cancel(self, future: cf.Future[None]) -> cf.Future[None]:
        """Abort the transfer behind `future`; done once no NIXL request writes any more."""
        return self.submit(lambda: self._abort(future))

    def inflight(self) -> int:
        return self.call(lambda: len(self._inflight))

    @property
    def stopped(self) -> bool:
        return not self._thread.is_alive()

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        next_notify = time.monotonic()
        while True:
            wait_s = self._wait_s(next_notify)
            try:
                job = self._jobs.get(timeout=wait_s) if wait_s > 0 else self._jobs.get_nowait()
                if job is None:
                    break
                job()
            except queue.Empty:
                if wait_s == 0:
                    time.sleep(0)  # spinning: let the event loop's thread have the GIL
            self._check_inflight()
            if time.monotonic() >= next_notify:
                self._drain_notifs()
                next_notify = time.monotonic() + self._notify_interval_s
        for item in list(self._inflight):
            self._finish(item, TransferError("transfer agent closed"))

    def _wait_s(self, next_notify: float) -> float:
        wake = min([next_notify, *(i.next_check for i in self._inflight)])
        return max(wake - time.monotonic(), 0.0)

    def _post(
        self,
        make_handle: MakeHandle,
        deadline: Deadline,
        on_finish: OnFinish,
        fut: cf.Future[None],
        on_done: OnDone | None,
    ) -> None:
        if not fut.set_running_or_notify_cancel():
            return  # the caller gave up before the transfer started
        try:
            agent, handle = make_handle()
        except BaseException as exc:
            fut.set_exception(as_transfer_error(exc))
            return
        now = time.monotonic()
        first = _FIRST_WAIT_S / 2  # the first wait after the spin: doubled, 50 us
        item = _Inflight(agent, handle, fut, on_finish, deadline, now, now, first, on_done)
        try:
            state = agent.transfer(handle)
        except Exception as exc:
            self._finish(item, as_transfer_error(exc))
            return
        item.spin_until = time.monotonic() + _SPIN_S
        self._settle(item, state)

    def _check_inflight(self) -> None:
        now = time.monotonic()
        for item in [i for i in self._inflight if i.next_check <= now]:
            try:
                state = item.agent.check_xfer_state(item.handle)
            except Exception as exc:
                self._finish(item, as_transfer_error(exc))
                continue
            self._settle(item, state)

    def _settle(self, item: _Inflight, state: str) -> None:
        if state == "DONE":
            self._finish(item, None)
        elif state != "PROC":
            self._finish(item, TransferError(f"NIXL transfer failed (state {state})"))
        elif item.deadline.expired():
            budget = item.deadline.budget_s
            self._finish(item, TransferTimeout(f"transfer exceeded its deadline of {budget:.3f} s"))
        else:
            if item not in self._inflight:
                self._inflight.append(item)
            now = time.monotonic()
            if now < item.spin_until:
                item.next_check = now
                return
            item.wait_s = min(item.wait_s * 2, _MAX_WAIT_S)
            item.next_check = min(now + item.wait_s, item.deadline.at)

    def _abort(self, fut: cf.Future[None]) -> None:
        for item in list(self._inflight):
            if item.future is fut:
                self._finish(item, TransferCancelled("transfer cancelled"))

    def _finish(self, item: _Inflight, error: TransferError | None) -> None:
        if item in self._inflight:
            self._inflight.remove(item)
        if error is None:
            _call(item.on_done, item.agent, item.handle, what="transfer report hook")
            settle(item.future, None)  # the blocks are in: the caller goes on now
        _release(item.handle)
        _call(item.on_finish, error, what="transfer completion hook")
        if error is not None:
            settle(item.future, error)

    def _drain_notifs(self) -> None:
        for agent, on_notif in self._sources:
            try:
                notifs = agent.get_new_notifs()
            except Exception:
                logger.exception("NIXL notification poll failed")
                continue
            for sender, messages in notifs.items():
                for message in messages:
                    on_notif(sender, message)


def _call(hook: Callable[..., None] | None, *args: Any, what: str) -> None:
    if hook is None:
        return
    try:
        hook(*args)
    except Exception:
        logger.exception("%s failed", what)


def _release(handle: Any) -> None:
    try:
        handle.release()  # cancels a request still in progress
    except Exception:
        logger.exception("NIXL could not release a transfer handle; its request may linger")


def as_transfer_error(exc: BaseException) -> TransferError:
    """Map an exception raised by NIXL (or our own code) to a TransferError."""
    if isinstance(exc, TransferError):
        return exc
    name = type(exc).__name__
    if name == "nixlRemoteDisconnectError":
        return PeerUnavailable(f"peer disconnected ({name})")
    return TransferError(f"NIXL error: {name}: {exc}")
