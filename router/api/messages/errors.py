"""Anthropic's error shape: `{"type": "error", "error": {"type": ..., "message": ...}}`.

The router's errors (router.errors.APIError) keep their status; their type becomes
Anthropic's for that status, and the message names the parameter (Anthropic's shape has no
field for it).
"""

from __future__ import annotations

from typing import Any

from router.errors import APIError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def anthropic_body(err: APIError) -> dict[str, Any]:
    default = "api_error" if err.status >= 500 else "invalid_request_error"
    message = err.message
    if err.param is not None and err.param not in message:
        message = f"{err.param}: {message}"
    return {"type": "error", "error": {"type": _TYPES.get(err.status, default), "message": message}}
