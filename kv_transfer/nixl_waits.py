"""Waiting on NIXL transfers from the event loop: several at once, all or none, and a
failure named after the agent and ranks it came from."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any

from kv_transfer.errors import TransferCancelled, TransferError


def named(exc: TransferError, label: str) -> TransferError:
    """``exc`` with ``label`` in front of its message (same type), or as it is."""
    if not label:
        return exc
    try:
        return type(exc)(f"{label}: {exc}")
    except TypeError:  # an error type with another constructor
        return exc


async def all_or_none(jobs: Sequence[Coroutine[Any, Any, None]]) -> None:
    """Run ``jobs`` at once; the first failure cancels the others and is raised once none
    of them writes any more."""
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    real = [e for e in errors if not isinstance(e, asyncio.CancelledError | TransferCancelled)]
    if real or errors:
        raise (real or errors)[0]
