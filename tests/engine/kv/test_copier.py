"""The KV tier copier: the next forward waits for the copies out of every device block it
reuses, including a block saved and reused within the same step."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from engine.kv.cache import KVLayout, allocate_kv_cache
from engine.kv.copier import TierCopier
from engine.kv.tier_book import CopyKind, CopyOrder

LAYOUT = KVLayout("m", "float32", block_size=4, num_layers=1, num_kv_heads=1, head_dim=4)


@pytest.fixture
def held() -> Iterator[tuple[TierCopier, threading.Event]]:
    """A copier whose thread holds each copy until the event is set."""
    go = threading.Event()
    copier = TierCopier(allocate_kv_cache(LAYOUT, 4, torch.device("cpu")), LAYOUT, 4, None)
    real = copier._copy

    def held_copy(order: CopyOrder) -> None:
        assert go.wait(60)
        real(order)

    copier._copy = held_copy  # type: ignore[method-assign]
    yield copier, go
    go.set()
    copier.close()


def test_a_block_saved_and_reused_in_one_step_waits_for_its_save(
    held: tuple[TierCopier, threading.Event],
) -> None:
    copier, go = held
    copier.kv_cache[2].fill_(7.0)
    copier.submit([CopyOrder(CopyKind.DEVICE_TO_HOST, 2, 1)], evicted=[2])
    with pytest.raises(TimeoutError):  # the save is held: the forward may not write block 2
        copier.wait(timeout_s=0.2)
    go.set()
    copier.wait()
    copier.kv_cache[2].fill_(0.0)  # the forward reuses it: the host copy keeps the old KV
    assert bool((copier.host[1] == 7.0).all())


def test_a_save_of_an_unreused_block_does_not_hold_the_forward(
    held: tuple[TierCopier, threading.Event],
) -> None:
    copier, _ = held
    copier.submit([CopyOrder(CopyKind.DEVICE_TO_HOST, 2, 1)], evicted=[])
    copier.wait(timeout_s=10)  # write-behind: off the step's critical path
    assert copier.backlog == 1


def test_a_later_reuse_waits_for_an_earlier_save(
    held: tuple[TierCopier, threading.Event],
) -> None:
    copier, go = held
    copier.submit([CopyOrder(CopyKind.DEVICE_TO_HOST, 3, 0)], evicted=[])
    copier.submit([], evicted=[3])
    with pytest.raises(TimeoutError):
        copier.wait(timeout_s=0.2)
    go.set()
    copier.wait()
