"""The error answers of a node: the protocol's NodeErrorResponse with an HTTP status.

Handlers raise NodeError (or use `checked_async`, which turns the engine's ValueErrors into
400s naming the parameter); node.server renders them.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

from fastapi.responses import JSONResponse

from cluster.protocol import ErrorInfo, NodeErrorResponse

T = TypeVar("T")


class NodeError(Exception):
    """An answer other than 200, in the protocol's `NodeErrorResponse` format."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.info = ErrorInfo(code=code, message=message, param=param)

    def response(self) -> JSONResponse:
        body = NodeErrorResponse(error=self.info).model_dump(mode="json")
        headers = {"Retry-After": "1"} if self.status in (429, 503) else None
        return JSONResponse(body, status_code=self.status, headers=headers)


def bad_request(message: str, param: str | None = None) -> NodeError:
    return NodeError(400, "bad_request", message, param)


async def checked_async(work: Awaitable[T], param: str | None = None) -> T:
    """`await work`, with a ValueError turned into a 400 naming `param`."""
    try:
        return await work
    except ValueError as exc:
        raise bad_request(str(exc), param) from None


def not_ready(message: str = "the node is starting or stopping") -> NodeError:
    return NodeError(503, "not_ready", message)
