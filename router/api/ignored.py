"""Request fields the router ignores (not among its own, as OpenAI clients send extras): each
request model notes their names while it validates, never their values; the endpoints log
and count them (splitserve_router_ignored_fields_total{route}), as vLLM logs them."""

from __future__ import annotations

import functools
import re
from typing import Any, Self

from pydantic import BaseModel, ModelWrapValidatorHandler, PrivateAttr, model_validator

MAX_SHOWN = 16  # names in one log line at most
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-\[\]]")  # a name stays one key=value token


class NotesIgnored(BaseModel):
    """A model that remembers the names of the fields it ignored."""

    _ignored: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _note_ignored(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        model = handler(data)
        if isinstance(data, dict):
            known = _names(cls)
            ignored = tuple(str(k) for k in data if k not in known)
            if ignored:
                model._ignored = ignored
        return model


@functools.cache
def _names(cls: type[BaseModel]) -> frozenset[str]:
    """The field names `cls` reads: its fields' names and aliases."""
    fields = cls.model_fields.items()
    return frozenset(name for n, f in fields for name in (n, f.alias) if name is not None)


def ignored_fields(model: BaseModel) -> list[str]:
    """The names `model` and the models inside it ignored, in order and once each; a nested
    one is named by the field it came in (`messages.name_`)."""
    found: dict[str, None] = {}
    _collect(model, "", found)
    return list(found)


def _collect(model: BaseModel, prefix: str, found: dict[str, None]) -> None:
    if isinstance(model, NotesIgnored):
        found.update((prefix + name, None) for name in model._ignored)
    for name in type(model).model_fields:
        value = getattr(model, name)
        for item in value if isinstance(value, list | tuple) else (value,):
            if isinstance(item, BaseModel):
                _collect(item, f"{prefix}{name}.", found)


def shown(names: list[str]) -> str:
    """The names for a log line: each one token (odd characters as `?`), MAX_SHOWN at most."""
    safe = [_UNSAFE.sub("?", name[:64]) for name in names[:MAX_SHOWN]]
    more = len(names) - len(safe)
    return ",".join(safe) + (f",+{more}" if more > 0 else "")
