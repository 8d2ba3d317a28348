"""The JSON bodies of a node's /internal/* calls, parsed by pydantic straight from the bytes.

A FastAPI body parameter runs json.loads, then validates the Python objects it made: for a
prompt of 8,192 token ids that took 1.1-1.3 ms per call on the 2-core Xeon, against 0.5 ms
with `model_validate_json` (384 ids: about 0.06 ms saved), on the path of every request's
first token. A bad body still answers 400 naming the parameter, through the
RequestValidationError handler of node.server.
"""

from __future__ import annotations

from typing import TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


async def read_body(request: Request, cls: type[M]) -> M:
    """The request's body as a `cls`; RequestValidationError (a 400) when it is not one."""
    raw = await request.body()
    try:
        return cls.model_validate_json(raw)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None
