"""Start-up phases as key=value log lines: `phase=NAME begin`, then `phase=NAME seconds=S`
once it has passed (kernels, weights, kv_cache; a node adds transfer). `splitserve up` shows
them while its nodes start (launcher.up_progress reads these lines)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("splitserve.engine.phases")


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Log the start of phase `name` and, unless it raised, its duration."""
    log.info("phase=%s begin", name)
    started = time.monotonic()
    yield
    log.info("phase=%s seconds=%.2f", name, time.monotonic() - started)
