"""Request bodies parsed into the request models, and validation errors turned into a 400
naming the bad parameter (a path through the models' field names)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from router.api.requests import (
    CalledFunction,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    FunctionDefinition,
    FunctionName,
    JSONSchemaFormat,
    NamedToolChoice,
    ResponseFormat,
    StreamOptions,
    TextPart,
    ToolCallIn,
    ToolDefinition,
)
from router.errors import APIError, bad_request


def field_names(*classes: type[BaseModel]) -> frozenset[str]:
    """The names a parameter path may hold: the fields (and aliases) of `classes`."""
    return frozenset(
        name
        for cls in classes
        for key, f in cls.model_fields.items()
        for name in (key, f.alias)
        if name is not None
    )


_FIELD_NAMES = field_names(
    CompletionRequest, ChatCompletionRequest, ChatMessage, TextPart, StreamOptions, ToolCallIn,
    CalledFunction, ResponseFormat, JSONSchemaFormat, ToolDefinition, FunctionDefinition,
    NamedToolChoice, FunctionName,
)  # fmt: skip


def parse_request(cls: type[BaseModel], raw: bytes, names: frozenset[str] = _FIELD_NAMES) -> Any:
    """Validate a JSON body into `cls`, or raise a 400 APIError naming the bad parameter
    (a path through the fields in `names`)."""
    try:
        return cls.model_validate_json(raw)
    except ValidationError as exc:
        raise to_api_error(exc, names) from None


def to_api_error(exc: ValidationError, names: frozenset[str] = _FIELD_NAMES) -> APIError:
    """The 400 of a validation error, naming the parameter (a path through `names`)."""
    err = exc.errors(include_url=False, include_input=False)[0]
    if err["type"] == "json_invalid":
        return bad_request(f"malformed JSON body: {err['msg']}", code="invalid_json")
    param = _param(err["loc"], names)
    if param is None:
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "model_type":
            msg = "request body must be a JSON object"
        return bad_request(msg, code="invalid_request")
    if err["type"] == "missing":
        return bad_request(f"missing required parameter '{param}'", param=param, code="missing")
    msg = str(err["msg"]).removeprefix("Value error, ")
    return bad_request(f"invalid '{param}': {msg}", param=param, code="invalid_value")


def _param(loc: tuple[int | str, ...], names: frozenset[str]) -> str | None:
    """`messages[0].content` from a pydantic location, skipping union-member tags."""
    param = ""
    for part in loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif part in names:
            param += f".{part}" if param else part
    return param or None
