"""The import steps on plain numbers: which blocks move, and the wait for free blocks."""

from __future__ import annotations

import time
from typing import Any

import pytest

from cluster.protocol import DecodeRequest, SamplingSpec
from decode_node import importer
from decode_node.importer import DecodeJob, reserve, transfer_pairs
from engine.sampling_params import SamplingParams
from engine.schedule import ImportPlan
from node.errors import NodeError


def test_only_blocks_missing_from_the_local_cache_move() -> None:
    # 9 KV tokens in blocks of 4: the first block is cached here, blocks 2 and 3 move
    plan = ImportPlan(block_ids=(7, 8, 9), num_cached_tokens=4, num_kv_tokens=9, block_size=4)
    assert transfer_pairs(plan, [20, 21, 22]) == ([21, 22], [8, 9])


def test_a_fully_cached_prompt_moves_no_block() -> None:
    # 8 KV tokens, both blocks cached; block 9 (the next token's) is the request's own
    plan = ImportPlan(block_ids=(7, 8, 9), num_cached_tokens=8, num_kv_tokens=8, block_size=4)
    assert transfer_pairs(plan, [20, 21]) == ([], [])


class _FullLoop:
    """An engine loop whose cache never has room."""

    def __init__(self) -> None:
        self.calls = 0

    async def call(self, command: Any) -> None:
        self.calls += 1


async def test_no_room_answers_503_after_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importer, "RESERVE_WAIT_S", 0.2)
    req = DecodeRequest(request_id="r", prompt_token_ids=[1, 2], sampling=SamplingSpec())
    loop = _FullLoop()
    start = time.monotonic()
    with pytest.raises(NodeError) as caught:
        await reserve(loop, DecodeJob(req, SamplingParams()))  # type: ignore[arg-type]
    assert caught.value.status == 503 and caught.value.info.code == "overloaded"
    assert 0.2 <= time.monotonic() - start < 1.0
    assert loop.calls > 2  # it retried
