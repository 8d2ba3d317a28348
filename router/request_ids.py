"""`x-request-id` on every reply of the router: the client's own when it sent a usable one,
else a new one. The id and the arrival time go into the request's scope state
(`request.state.request_id`, `request.state.arrived_ns`) for the request's trail."""

from __future__ import annotations

import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cluster.tracing import now_ns

HEADER = "x-request-id"
_USABLE = re.compile(r"^[A-Za-z0-9._:/=+-]{1,128}$")


def request_id_of(given: str | None) -> str:
    """The client's id when it is 1 to 128 characters of [A-Za-z0-9._:/=+-], else a new one."""
    if given is not None and _USABLE.match(given):
        return given
    return uuid.uuid4().hex


class RequestIds:
    """Pure ASGI middleware: stamps arrival, picks the id, and adds the header to the reply."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        arrived = now_ns()
        given = next((v for k, v in scope["headers"] if k == HEADER.encode()), None)
        request_id = request_id_of(given.decode("latin-1") if given is not None else None)
        scope.setdefault("state", {}).update(request_id=request_id, arrived_ns=arrived)

        async def with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0] != HEADER.encode()]
                message["headers"] = [*headers, (HEADER.encode(), request_id.encode())]
            await send(message)

        await self.app(scope, receive, with_id)
