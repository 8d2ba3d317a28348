"""Fixtures of the CPU kernel tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(params=[1, 2], ids=["threads1", "threads2"])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    """The kernels' thread count for one test (torch's, restored after)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)
