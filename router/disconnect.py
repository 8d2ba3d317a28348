"""Non-streaming answers stop working for a client that has gone away."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from fastapi import Request


async def until_disconnect(request: Request, work: Any) -> Any:
    """Await `work`; cancel it and return None if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return None if task.cancelled() else task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
