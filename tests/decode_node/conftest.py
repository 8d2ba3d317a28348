"""Fixtures of the node tests: the tiny random Llama on disk and an embedded Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from node_harness import save_tiny_model

from cluster.redis_server import EmbeddedRedis


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with EmbeddedRedis() as server:
        yield server.url
