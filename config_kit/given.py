"""A component's settings as another config takes them in: a `part` field holds them as
given (`Given`), checked by the component's declarations and its `check_relations`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import field
from typing import Any, Generic, TypeVar

from config_kit.declare import PART, own
from config_kit.values import check_values

C = TypeVar("C")


def part(cls: type) -> Any:
    """A field holding `cls`'s settings as given (a `Given`): its flags and variables are the
    composing config's, its checks `cls`'s own."""
    return field(default_factory=lambda: Given(cls, {}), metadata={PART: cls})


class Given(Generic[C]):
    """A component's settings as given (flags, variables), checked by the component's
    declarations and its `check_relations`; what is not given keeps the component's
    default, which its constructor fills in later (a device-dependent default too).
    Attributes read a setting: the given value, else the declared default."""

    __slots__ = ("owner", "values")

    def __init__(self, owner: type[C], values: Mapping[str, Any]) -> None:
        object.__setattr__(self, "owner", owner)
        object.__setattr__(self, "values", check_values(owner, values))

    def __getattr__(self, name: str) -> Any:
        if name in Given.__slots__ or name.startswith("__"):
            raise AttributeError(name)
        for d in own(self.owner):
            if d.field == name:
                return self.values.get(name, d.default)
        raise AttributeError(f"{self.owner.__name__} declares no setting {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def replace(self, **changes: Any) -> Given[C]:
        """These settings with `changes` (by field), checked again."""
        return Given(self.owner, {**self.values, **changes})

    def build(self, **more: Any) -> C:
        """The component's config from the given settings and `more` (its other fields)."""
        return self.owner(**self.values, **more)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Given):
            return NotImplemented
        return (self.owner, self.values) == (other.owner, other.values)

    def __hash__(self) -> int:
        return hash((self.owner, tuple(sorted(self.values))))

    def __repr__(self) -> str:
        return f"Given({self.owner.__name__}, {dict(self.values)})"
