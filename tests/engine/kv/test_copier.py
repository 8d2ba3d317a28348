"""The KV tier copier: the next forward waits for the copies out of every device block it
reuses, including a block saved and reused within the same step, and never for file writes;
close writes the queued files, or gives up on a stalled disk at its deadline."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from engine.kv.cache import KVLayout, allocate_kv_cache
from engine.kv.copier import TierCopier
from engine.kv.disk_store import DiskStore
from engine.kv.tier_book import CopyKind, CopyOrder
from engine.kv.tier_index import TierEntry
from models.block_hash import block_hash

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


@pytest.fixture
def stalled_disk(tmp_path: Path) -> Iterator[tuple[TierCopier, threading.Event]]:
    """A copier with a disk tier whose file writes wait for the event."""
    go = threading.Event()
    disk = DiskStore(tmp_path, LAYOUT)
    copier = TierCopier(allocate_kv_cache(LAYOUT, 4, torch.device("cpu")), LAYOUT, 4, disk)
    real = disk.write

    def stalled_write(entry: TierEntry, block: torch.Tensor) -> None:
        assert go.wait(60)
        real(entry, block)

    disk.write = stalled_write  # type: ignore[method-assign]
    yield copier, go
    go.set()
    copier.close()


def _writes(n: int) -> list[CopyOrder]:
    tokens = [(i, i, i, i) for i in range(n)]
    entries = [TierEntry(block_hash(None, t), None, t, i) for i, t in enumerate(tokens)]
    return [CopyOrder(CopyKind.HOST_TO_DISK, slot=e.slot, entry=e) for e in entries]


def test_a_load_does_not_wait_behind_file_writes(
    stalled_disk: tuple[TierCopier, threading.Event],
) -> None:
    copier, go = stalled_disk
    copier.host[3].fill_(5.0)
    copier.submit(_writes(3), evicted=[])
    copier.submit([CopyOrder(CopyKind.HOST_TO_DEVICE, 1, 3, blocking=True)], evicted=[])
    copier.wait(timeout_s=10)  # the load is done while the disk is still stalled
    assert bool((copier.kv_cache[1] == 5.0).all())
    assert copier.disk_backlog == 3 and copier.writes_done == 0
    go.set()
    copier.flush()
    assert copier.writes_done == 3 and copier.disk_backlog == 0


def test_close_writes_the_queue_and_gives_up_on_a_stalled_disk_at_its_deadline(
    stalled_disk: tuple[TierCopier, threading.Event], tmp_path: Path
) -> None:
    copier, go = stalled_disk
    copier.submit(_writes(3), evicted=[])
    flushed = copier.close(timeout_s=0.3)
    assert (flushed.written, flushed.left) == (0, 3) and flushed.seconds < 10
    go.set()
    quick = TierCopier(copier.kv_cache, LAYOUT, 4, DiskStore(tmp_path / "quick", LAYOUT))
    quick.submit(_writes(3), evicted=[])
    assert quick.close().left == 0 and len(list((tmp_path / "quick").glob("*.kvb"))) == 3
