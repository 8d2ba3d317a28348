from __future__ import annotations

import torch

from kv_transfer.hugepages import use_hugepages


def test_moving_to_huge_pages_keeps_address_and_content() -> None:
    kv = torch.randn((6 << 20) // 4)  # 6 MiB of float32: whole huge pages inside
    before, address = kv.clone(), kv.data_ptr()
    assert isinstance(use_hugepages(kv), bool)  # False where the kernel cannot collapse
    assert kv.data_ptr() == address and torch.equal(kv, before)


def test_small_or_device_tensors_are_left_alone() -> None:
    assert use_hugepages(torch.zeros(16)) is False
