"""The reader's W3C trace context travels in the TCP READ message: the owner reports each
READ it served for that context (its bytes and times), so its span joins the reader's trace;
a READ without a context reports nothing."""

from __future__ import annotations

import threading
import time

import torch

from kv_transfer.transport import Served
from tests.kv_transfer.test_agent import tcp_agent
from tests.kv_transfer.test_tcp_heads import BLOCKS, agent, split

TRACE = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}


class Reports:
    """What an owner's on_served hook was called with (on its serving threads)."""

    def __init__(self) -> None:
        self.served: list[Served] = []
        self._lock = threading.Lock()

    def __call__(self, served: Served) -> None:
        with self._lock:
            self.served.append(served)

    def wait_bytes(self, nbytes: int, timeout_s: float = 20.0) -> list[Served]:
        deadline = time.monotonic() + timeout_s
        while sum(s.nbytes for s in self.served) < nbytes:
            assert time.monotonic() < deadline, f"served {self.served}, want {nbytes} bytes"
            time.sleep(0.01)
        return list(self.served)


async def test_a_read_with_a_trace_context_is_reported_by_the_owner() -> None:
    owner, reader = tcp_agent("owner"), tcp_agent("reader")
    reports = Reports()
    owner.transport.on_served(reports)
    try:
        before = time.monotonic()
        result = await reader.read_blocks(owner.info, [2, 5], [0, 1], request_id="r1", trace=TRACE)
        (served,) = reports.wait_bytes(result.nbytes)
        assert served.request_id == "r1" and served.trace == TRACE
        assert served.nbytes == result.nbytes > 0
        assert before <= served.start <= served.end <= time.monotonic()
        await reader.read_blocks(owner.info, [3], [2], request_id="r2")  # no context
        await reader.read_blocks(owner.info, [4], [3], request_id="r3", trace=TRACE)
        assert [s.request_id for s in reports.wait_bytes(result.nbytes * 3 // 2)] == ["r1", "r3"]
    finally:
        owner.close()
        reader.close()


async def test_each_sending_ranks_read_carries_the_context() -> None:
    """Nodes that split the heads differently: one READ per sending rank, each reported."""
    full = torch.randn(BLOCKS, 2, 2, 4, 4, 8)
    owner = agent("owner", split(full, 2, 8))
    reader = agent("reader", split(torch.zeros_like(full), 1, 8))
    reports = Reports()
    owner.transport.on_served(reports)
    try:
        result = await reader.read_blocks(owner.info, [3, 5], [1, 6], request_id="r1", trace=TRACE)
        served = reports.wait_bytes(result.nbytes)
        assert len(served) == 2 and all(s.trace == TRACE for s in served)
        assert sum(s.nbytes for s in served) == result.nbytes
    finally:
        owner.close()
        reader.close()
