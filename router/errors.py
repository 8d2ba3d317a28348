"""OpenAI-style errors: one exception type and the JSON body clients parse.

Every error the router returns has the body
`{"error": {"message": str, "type": str, "param": str | null, "code": str | null}}`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi.responses import JSONResponse


class APIError(Exception):
    """An error answered to the client with `status` and the OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)

    def response(self, shape: Callable[[APIError], dict[str, Any]] | None = None) -> JSONResponse:
        """The answer, its body OpenAI's error object or the one `shape` makes."""
        headers = {"Retry-After": str(self.retry_after_s)} if self.retry_after_s else None
        body = shape(self) if shape is not None else self.body()
        return JSONResponse(body, status_code=self.status, headers=headers)


def error_body(
    message: str, *, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def overloaded(message: str, retry_after_s: int) -> APIError:
    return APIError(
        429, message, type="rate_limit_error", code="overloaded", retry_after_s=retry_after_s
    )


def unavailable(message: str, retry_after_s: int, code: str = "no_healthy_node") -> APIError:
    return APIError(503, message, type="server_error", code=code, retry_after_s=retry_after_s)


def internal_error() -> APIError:
    return APIError(500, "internal server error", type="server_error", code="internal_error")
