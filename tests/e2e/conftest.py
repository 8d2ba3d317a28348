"""The oracle of the end-to-end tests: the engine's offline output in this process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from oracle import Oracle


@pytest.fixture(scope="session")
def oracle(default_model_dir: Path) -> Iterator[Oracle]:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield Oracle(default_model_dir)
    finally:
        torch.set_num_threads(threads)
