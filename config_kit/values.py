"""A setting's value: read from text (a flag, a variable), brought to its declared type, and
checked against its declaration; errors name the setting."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from config_kit.declare import Declared, own

_TRUE = {"1", "true", "t", "yes", "y", "on"}
_FALSE = {"0", "false", "f", "no", "n", "off"}


class SettingError(ValueError):
    """A bad value of one setting; `declared` names it."""

    def __init__(self, declared: Declared, problem: str) -> None:
        super().__init__(f"{declared.label} {problem}")
        self.declared = declared
        self.problem = problem


class Secret:
    """A secret text (a key, a token): never shown by repr or str."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def from_text(d: Declared, text: str) -> Any:
    """The value a flag or variable's text gives `d` (SettingError when it gives none)."""
    try:
        if d.kind is list:
            return _text_list(text)
        if d.kind is bool:
            word = text.strip().lower()
            if word not in _TRUE | _FALSE:
                raise ValueError
            return word in _TRUE
        if d.kind in (int, float):
            return d.kind(text)
    except ValueError:
        raise SettingError(d, f"must be {_noun(d)}, got {text!r}") from None
    return coerce(d, text)


def _text_list(text: str) -> list[str]:
    """A JSON array of strings (how the environment gives a list)."""
    items = json.loads(text)
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ValueError
    return items


def coerce(d: Declared, value: Any) -> Any:
    """`value` as `d`'s type (a str for a Path, a Secret or an Enum; an int for a float)."""
    if d.setting.normalize is not None and value is not None:
        try:
            value = d.setting.normalize(value)
        except ValueError as exc:
            raise SettingError(d, f"is bad: {exc}") from None
    if value is None:
        if d.optional or d.default is None:
            return None
        raise SettingError(d, "must be given")
    if isinstance(value, d.kind) and not (d.kind is int and isinstance(value, bool)):
        return value
    if d.kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if d.kind is list and isinstance(value, tuple):
        return list(value)
    if isinstance(value, str) and (d.kind in (Path, Secret) or issubclass(d.kind, Enum)):
        try:
            return d.kind(value)
        except ValueError:
            pass
    raise SettingError(d, f"must be {_noun(d)}, got {value!r}")


def _noun(d: Declared) -> str:
    if d.choices:
        return "one of " + ", ".join(d.choices)
    names = {int: "an integer", float: "a number", bool: "true or false", list: "a list"}
    return names.get(d.kind, "a text")


def check(d: Declared, value: Any) -> None:
    """SettingError unless `value` (of `d`'s type, or None) keeps `d`'s bounds and choices."""
    if value is None:
        return
    s = d.setting
    if d.choices and str(value.value if isinstance(value, Enum) else value) not in d.choices:
        raise SettingError(d, f"must be one of {', '.join(d.choices)}, got {value!r}")
    if s.pattern is not None and not re.fullmatch(s.pattern, str(value)):
        raise SettingError(d, f"must match {s.pattern}, got {value!r}")
    for bound, ok, words in (
        (s.ge, lambda v, b: v >= b, ">="),
        (s.gt, lambda v, b: v > b, ">"),
        (s.le, lambda v, b: v <= b, "<="),
        (s.lt, lambda v, b: v < b, "<"),
    ):
        if bound is not None and not ok(value, bound):
            raise SettingError(d, f"must be {words} {bound:g}, got {value!r}")


def check_fields(config: Any) -> None:
    """Bring each declared setting of `config` (a frozen dataclass, in its __post_init__) to
    its type and check it; SettingError names the first bad one."""
    for d in own(type(config)):
        value = coerce(d, getattr(config, d.field))
        check(d, value)
        object.__setattr__(config, d.field, value)


def check_values(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """Given values of `cls`'s settings (by field), typed and checked, then `cls`'s
    `check_relations` (when it has one) on them and the defaults of the rest."""
    by_field = {d.field: d for d in own(cls)}
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name not in by_field:
            raise ValueError(f"{cls.__name__} declares no setting {name!r}")
        out[name] = coerce(by_field[name], value)
        check(by_field[name], out[name])
    relations = getattr(cls, "check_relations", None)
    if relations is not None:
        relations(SimpleNamespace(**(_defaults(cls) | out)))
    return out


def _defaults(cls: type) -> dict[str, Any]:
    """Field -> default of each of `cls`'s fields that has one."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif callable(f.default_factory):
            out[f.name] = f.default_factory()
    return out
