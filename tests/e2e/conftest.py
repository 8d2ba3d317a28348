"""The oracle of the end-to-end tests: the engine's offline output in this process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from oracle import Oracle


@pytest.fixture(scope="session")
def oracle(default_model_dir: Path) -> Iterator[Oracle]:
    yield Oracle(default_model_dir)  # on the threads tests/conftest.py gave this worker
