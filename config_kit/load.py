"""A config from its settings: the SPLITSERVE_* environment, overridden by given values (the
flags); errors name the setting with its flag and variable."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, TypeVar

from config_kit.declare import ENV_PREFIX, declared, parts
from config_kit.given import Given
from config_kit.values import SettingError, from_text

T = TypeVar("T")
__all__ = ["ENV_PREFIX", "SettingsError", "build", "from_environment", "load"]


class SettingsError(ValueError):
    """Invalid settings; the message names the bad one, its flag and its variable."""


def from_environment(cls: type, environ: Mapping[str, str]) -> dict[str, Any]:
    """Public name -> value of each of `cls`'s settings its variable sets (empty: unset)."""
    out: dict[str, Any] = {}
    for d in declared(cls):
        text = environ.get(d.env, "")
        if text:
            try:
                out[d.name] = from_text(d, text)
            except SettingError as exc:
                raise SettingsError(f"invalid {cls.__name__}: {d.env}: {exc.problem}") from None
    return out


def load(
    cls: type[T],
    given: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    command: str | None = None,
    **values: Any,
) -> T:
    """`cls` from the environment (os.environ unless given), overridden by the subcommand's
    `command` setting (a node's role), then by `given` and `values` by public name (None: not
    given); SettingsError names a bad setting."""
    merged = from_environment(cls, os.environ if environ is None else environ)
    if command is not None:
        merged.update({d.name: command for d in declared(cls) if d.setting.command})
    merged.update({k: v for k, v in {**(given or {}), **values}.items() if v is not None})
    return build(cls, **merged)


def build(cls: type[T], **values: Any) -> T:
    """`cls` from values by public name, a part's settings in its `Given`; SettingsError
    names a bad one (no environment is read)."""
    by_name = {d.name: d for d in declared(cls)}
    own: dict[str, Any] = {}
    given: dict[str, dict[str, Any]] = {name: {} for name in parts(cls)}
    for name, value in values.items():
        d = by_name.get(name)
        if d is None:
            raise SettingsError(f"invalid {cls.__name__}: no setting {name!r}")
        (given[d.part] if d.part else own)[d.field] = value
    try:
        built: dict[str, Given[Any]] = {p: Given(parts(cls)[p], v) for p, v in given.items()}
        return cls(**own, **built)
    except SettingError as exc:
        where = _where(cls, exc)
        raise SettingsError(f"invalid {cls.__name__}: {where}: {exc.problem}") from None
    except ValueError as exc:
        raise SettingsError(f"invalid {cls.__name__}: {exc}") from None


def _where(cls: type, exc: SettingError) -> str:
    """The bad setting as a user gives it to `cls` (a part's under the composing config)."""
    for d in declared(cls):
        if (d.owner, d.field) == (exc.declared.owner, exc.declared.field):
            return d.where()
    return exc.declared.label
