"""Declaring settings: `setting(default, help, ...)` on a frozen dataclass's field, and
`declared(cls)`, every setting of a class with its name, type and default (a `part` field,
config_kit.given, takes in another component's settings: a node takes the engine's)."""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any

ENV_PREFIX = "SPLITSERVE_"
_SETTING = "config_kit.setting"
PART = "config_kit.part"  # a field's metadata key: the component it holds (config_kit.given)


class Up(StrEnum):
    """How `splitserve up` hands a setting to the processes it starts."""

    EACH = "each"  # an up flag; the same value to every process that declares the setting
    POOL = "pool"  # as EACH, and --prefill-NAME / --decode-NAME for one pool's nodes
    DECODE = "decode"  # an up flag for the decode and colocated nodes only
    SHARE = "share"  # an up flag for all nodes together: each node gets an equal part
    SUBDIR = "subdir"  # an up flag naming a directory: each node gets a subdirectory of it
    OWN = "own"  # up sets it for each process itself (address, port, id): no up flag


class Helm(StrEnum):
    """How the Helm chart sets a setting."""

    VALUES = "values"  # a key of the component's values (camelCase), handed on as its flag
    CHART = "chart"  # the chart sets it itself, from keys of its own or the pod's facts


@dataclass(frozen=True)
class Setting:
    """What a declaration says beyond its field's type and default."""

    help: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[str, ...] = ()
    pattern: str | None = None  # the whole text must match (str settings)
    name: str | None = None  # the public name (flag, variable, chart key), else the field's
    aliases: tuple[str, ...] = ()  # more flag names, e.g. vLLM's
    deprecated: tuple[str, ...] = ()  # old flag names: they work, with a warning, unlisted
    metavar: str | None = None
    up: Up = Up.EACH
    helm: Helm = Helm.VALUES
    command: bool = False  # the subcommand sets it (a node's role); a flag where it has several
    normalize: Callable[[Any], Any] | None = None  # applied first, e.g. a dtype's aliases


def setting(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    factory: Callable[[], Any] | None = None,
    **options: Any,
) -> Any:
    """A dataclass field that is a setting (see `Setting` for the options)."""
    metadata = {_SETTING: Setting(help=help, **options)}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Declared:
    """One declared setting of `owner` (reached through the composing config's `part` field)."""

    owner: type
    field: str
    kind: type  # int, float, str, bool, list (of str), pathlib.Path, Secret or an Enum
    optional: bool
    default: Any
    setting: Setting
    part: str | None = None

    @property
    def name(self) -> str:
        return self.setting.name or self.field

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def helm_key(self) -> str:
        first, *rest = self.name.split("_")
        return first + "".join(word.capitalize() for word in rest)

    @property
    def choices(self) -> tuple[str, ...]:
        if issubclass(self.kind, Enum):
            return tuple(str(m.value) for m in self.kind)
        return self.setting.choices

    @property
    def label(self) -> str:
        return f"{self.owner.__name__}.{self.field}"

    def where(self) -> str:
        """How a user gives it: `name (--flag, env VAR)`."""
        return f"{self.name} ({self.flag}, env {self.env})"


def declared(cls: type) -> tuple[Declared, ...]:
    """Every setting of `cls` in declaration order, its parts' settings in place."""
    return _declared(cls)


@functools.cache
def _declared(cls: type) -> tuple[Declared, ...]:
    hints = typing.get_type_hints(cls)
    out: list[Declared] = []
    for f in dataclasses.fields(cls):
        if PART in f.metadata:
            out.extend(dataclasses.replace(d, part=f.name) for d in declared(f.metadata[PART]))
        elif _SETTING in f.metadata:
            kind, optional, choices = _kind(hints[f.name])
            meta: Setting = f.metadata[_SETTING]
            if choices and not meta.choices:
                meta = dataclasses.replace(meta, choices=choices)
            default = f.default
            if callable(f.default_factory):
                default = f.default_factory()
            out.append(Declared(cls, f.name, kind, optional, default, meta))
    return tuple(out)


def own(cls: type) -> tuple[Declared, ...]:
    """`cls`'s own settings (not its parts')."""
    return tuple(d for d in declared(cls) if d.part is None)


def parts(cls: type) -> dict[str, type]:
    """Field name -> component, for each `part` of `cls`."""
    return {f.name: f.metadata[PART] for f in dataclasses.fields(cls) if PART in f.metadata}


def _kind(annotation: Any) -> tuple[type, bool, tuple[str, ...]]:
    """(base type, optional, choices of a Literal) of a field's annotation."""
    args = typing.get_args(annotation)
    optional = type(None) in args
    if optional:
        annotation = next(a for a in args if a is not type(None))
    if typing.get_origin(annotation) is typing.Literal:
        return str, optional, tuple(str(a) for a in typing.get_args(annotation))
    if typing.get_origin(annotation) is list:
        return list, optional, ()
    return annotation, optional, ()
