"""Declaring settings: `setting(default, help, ...)` on a frozen dataclass's field, `part(cls)`
for another component's settings a config takes in (a node takes the engine's), and
`declared(cls)`, every setting of a class with its name, type and default."""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, Generic, TypeVar

ENV_PREFIX = "SPLITSERVE_"
_SETTING = "config_kit.setting"
_PART = "config_kit.part"
C = TypeVar("C")


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


def part(cls: type) -> Any:
    """A field holding `cls`'s settings as given (a `Given`): its flags and variables are the
    composing config's, its checks `cls`'s own."""
    return field(default_factory=lambda: Given(cls, {}), metadata={_PART: cls})


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
        if _PART in f.metadata:
            out.extend(dataclasses.replace(d, part=f.name) for d in declared(f.metadata[_PART]))
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
    return {f.name: f.metadata[_PART] for f in dataclasses.fields(cls) if _PART in f.metadata}


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


class Given(Generic[C]):
    """A component's settings as given (flags, variables), checked by the component's
    declarations and its `check_relations`; what is not given keeps the component's
    default, which its constructor fills in later (a device-dependent default too).
    Attributes read a setting: the given value, else the declared default."""

    __slots__ = ("owner", "values")

    def __init__(self, owner: type[C], values: Mapping[str, Any]) -> None:
        from config_kit.values import check_values

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
