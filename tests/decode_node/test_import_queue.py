"""KV imports wait for blocks in (priority, arrival) order, bounded, each until its own
deadline; then 503."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from cluster.protocol import DecodeRequest
from decode_node.import_queue import ImportQueue
from decode_node.importer import DecodeJob
from engine.scheduler.plan import ImportPlan
from models.sampling_params import SamplingParams
from node.errors import NodeError

PLAN = ImportPlan(block_ids=(0,), num_cached_tokens=0, num_kv_tokens=2, block_size=4)


class _Engine:
    """Has room for `free` imports; records who got one."""

    def __init__(self) -> None:
        self.free = 0
        self.granted: list[str] = []

    def import_request(self, rid: str, *_: Any, **__: Any) -> ImportPlan | None:
        if self.free == 0:
            return None
        self.free -= 1
        self.granted.append(rid)
        return PLAN


class _Loop:
    def __init__(self) -> None:
        self.engine = _Engine()

    async def call(self, command: Any) -> Any:
        return command(self.engine)


async def _until(condition: Callable[[], bool], tasks: list[asyncio.Task[Any]]) -> None:
    """Wait for ``condition`` (a task that ended early fails the test with its error)."""
    deadline = time.monotonic() + 30
    while not condition():
        for task in tasks:
            if task.done():
                task.result()  # raises what ended it
        assert time.monotonic() < deadline, "the queue never reached the expected state"
        await asyncio.sleep(0.01)


def _job(rid: str, priority: int = 0, wait_s: float | None = None) -> DecodeJob:
    req = DecodeRequest(
        request_id=rid, prompt_token_ids=[1, 2], sampling=SamplingParams(), priority=priority,
        wait_s=wait_s,
    )  # fmt: skip
    return DecodeJob(req)


async def test_waiting_imports_get_blocks_in_priority_then_arrival_order() -> None:
    loop = _Loop()
    queue = ImportQueue(loop, max_waiting=16, max_wait_s=30)  # type: ignore[arg-type]
    tasks = [asyncio.create_task(queue.reserve(_job(f"b{i}", priority=5))) for i in range(10)]
    await _until(lambda: queue.waiting == 10, tasks)
    tasks.append(asyncio.create_task(queue.reserve(_job("urgent", priority=0))))
    await _until(lambda: queue.waiting == 11, tasks)
    loop.engine.free = 11  # blocks free up: the queue drains in order
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert loop.engine.granted == ["urgent"] + [f"b{i}" for i in range(10)]
    assert queue.waiting == 0


async def test_a_full_queue_and_a_passed_deadline_answer_503() -> None:
    loop = _Loop()
    queue = ImportQueue(loop, max_waiting=1, max_wait_s=30)  # type: ignore[arg-type]
    start = time.monotonic()
    first = asyncio.create_task(queue.reserve(_job("first", wait_s=0.3)))
    await _until(lambda: queue.waiting == 1, [first])
    with pytest.raises(NodeError) as full:
        await queue.reserve(_job("second"))
    assert full.value.status == 503 and "already wait" in full.value.info.message
    with pytest.raises(NodeError) as late:
        await first
    assert late.value.status == 503 and late.value.info.code == "overloaded"
    assert 0.3 <= time.monotonic() - start < 5 and queue.waiting == 0
