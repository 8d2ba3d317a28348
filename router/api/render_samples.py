"""HTTP answers for requests with several samples (n > 1, best_of): SSE chunks of every
choice interleaved, or one response with the chosen samples' choices."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from router.api.choices import Samples, best
from router.api.render import Formatter, chunks_of
from router.api.streaming import DONE, EventStreamResponse, sse
from router.disconnect import until_disconnect
from router.errors import APIError, internal_error

log = logging.getLogger("splitserve.router")


async def serve_samples(
    request: Request,
    samples: Samples,
    fmt: Formatter,
    num_choices: int,
    stream: bool,
    include_usage: bool,
) -> Response:
    """Start sample 0 (failures before token 1 answer with their HTTP status), then stream
    every sample or collect them and answer with the `num_choices` best."""
    try:
        await samples.start()
    except BaseException:
        await samples.close()
        raise
    if stream:
        return EventStreamResponse(_events(samples, fmt, include_usage), on_close=samples.close)
    try:
        done = await until_disconnect(request, _collect(samples))
    finally:
        await samples.close()
    if done is None:  # the client left; nobody reads this
        return Response(status_code=499)
    chosen = best(samples.samples, num_choices) if num_choices < len(samples.samples) else None
    deltas = [s.deltas for s in chosen or samples.samples]
    return JSONResponse(fmt.responses(deltas, samples.usage()).model_dump())


async def _collect(samples: Samples) -> bool:
    await samples.run()
    return True


async def _events(samples: Samples, fmt: Formatter, include_usage: bool) -> AsyncIterator[bytes]:
    """Each choice's chunks as its tokens arrive (each with its index and finish_reason),
    the usage chunk if asked, then `[DONE]`; a failure becomes an error event."""
    started: set[int] = set()
    try:
        async with aclosing(samples.stream()) as deltas:
            async for index, delta in deltas:
                piece = fmt.chunk(delta, index not in started, index)
                for one in chunks_of(piece):
                    started.add(index)
                    yield sse(one, include_usage)
        if include_usage:
            yield sse(fmt.usage_chunk(samples.usage()), include_usage)
    except APIError as err:
        yield sse(err.body())
    except Exception:
        log.exception("stream_failed id=%s", samples.first.request.request_id)
        yield sse(internal_error().body())
    yield DONE
