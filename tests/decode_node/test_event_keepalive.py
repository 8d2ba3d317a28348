"""A decode stream with no event due (its request queued behind others, a long step) sends empty
lines so the router's silence timeout does not take a busy node for a dead one; a hung engine
sends none; closing the stream mid-wait stops the generator and calls on_close."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

import pytest

from cluster.protocol import TokenEvent
from decode_node.events import EventStream

DEADLINE_S = 30.0


def _stream(release: asyncio.Event, alive: bool, closed: list[str]) -> EventStream:
    async def events() -> AsyncGenerator[TokenEvent, None]:
        try:
            await release.wait()
            yield TokenEvent(token_ids=[7], finished=True, finish_reason="stop")
        finally:
            closed.append("generator")

    return EventStream(events(), lambda: closed.append("on_close"), lambda: alive, 0.01)


def _lines(stream: EventStream) -> AsyncIterator[bytes]:
    body = stream.body_iterator
    assert isinstance(body, AsyncIterator)
    return body


async def _next(lines: AsyncIterator[bytes]) -> bytes:
    return await asyncio.wait_for(anext(lines), DEADLINE_S)


def test_keepalives_while_waiting_then_the_event() -> None:
    async def run() -> list[bytes]:
        release, closed = asyncio.Event(), []
        lines = _lines(_stream(release, alive=True, closed=closed))
        got = [await _next(lines) for _ in range(3)]
        release.set()
        while (line := await _next(lines)) == b"\n":
            pass
        got.append(line)
        with pytest.raises(StopAsyncIteration):
            await _next(lines)
        return got

    got = asyncio.run(run())
    assert got[:3] == [b"\n"] * 3
    event = TokenEvent.model_validate_json(got[3])
    assert event.token_ids == [7] and event.finished


def test_a_hung_engine_stays_silent() -> None:
    async def run() -> bytes:
        release, closed = asyncio.Event(), []
        lines = _lines(_stream(release, alive=False, closed=closed))
        pending = asyncio.ensure_future(anext(lines))
        # 50 keepalive periods pass with nothing sent; the event still comes through
        for _ in range(50):
            await asyncio.sleep(0.01)
            assert not pending.done()
        release.set()
        return await asyncio.wait_for(pending, DEADLINE_S)

    assert TokenEvent.model_validate_json(asyncio.run(run())).token_ids == [7]


def test_a_disconnect_mid_wait_closes_the_generator() -> None:
    """The ASGI call ends at the client's disconnect while the generator awaits its next
    event: the awaited step is cancelled, the generator closed and on_close called."""

    async def run() -> list[str]:
        release, closed = asyncio.Event(), []
        stream = _stream(release, alive=True, closed=closed)
        sent: list[dict[str, object]] = []
        disconnect = asyncio.Event()

        async def receive() -> dict[str, object]:
            await disconnect.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, object]) -> None:
            sent.append(message)
            if message.get("body") == b"\n":
                disconnect.set()  # the client leaves after the first keepalive

        scope = {"type": "http", "asgi": {"spec_version": "2.4"}}
        await asyncio.wait_for(stream(scope, receive, send), DEADLINE_S)
        return closed

    assert asyncio.run(run()) == ["generator", "on_close"]
