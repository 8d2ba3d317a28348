"""The TCP transport's wait on the reader threads of one READ (kv_transfer.tcp_transport)."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from typing import Any

import pytest

from kv_transfer import tcp_transport
from kv_transfer.deadline import Deadline
from kv_transfer.errors import TransferCancelled, TransferTimeout


class _Stuck:
    """A rank's READ whose thread ends (cancelled) only a while after its abort."""

    def __init__(self) -> None:
        self.aborted = threading.Event()
        self.ended = threading.Event()

    def run(self) -> None:
        self.aborted.wait(10)
        time.sleep(0.3)  # past the transport's grace
        self.ended.set()
        raise TransferCancelled("transfer cancelled")

    def abort(self) -> None:
        self.aborted.set()


def _transport() -> Any:
    transport = object.__new__(tcp_transport.TcpTransport)  # only the reader pool is used
    transport._executor = tcp_transport.cf.ThreadPoolExecutor(2)
    transport._lock, transport._inflight, transport.peak_inflight = threading.Lock(), 0, 0
    return transport


async def test_a_reader_thread_ending_after_the_grace_logs_no_unretrieved_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tcp_transport, "_STUCK_GRACE_S", 0.05)
    unhandled: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, ctx: unhandled.append(ctx))
    transport, job = _transport(), _Stuck()
    with pytest.raises(TransferTimeout, match="reader thread stalled"):
        await transport._run_all([job], Deadline.after(0.05))
    assert await asyncio.to_thread(job.ended.wait, 10)
    await asyncio.sleep(0.1)  # the thread's outcome reaches the loop
    gc.collect()
    transport._executor.shutdown()
    assert [c.get("message") for c in unhandled] == []
