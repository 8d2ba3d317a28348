"""JSON schema of a declared setting, as a chart's values.schema.json checks its key (an empty
string leaves a text setting unset, as the chart's defaults do)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from config_kit.declare import Declared
from config_kit.values import Secret

_TYPES: dict[type, str] = {int: "integer", float: "number", bool: "boolean", str: "string"}


def value_schema(d: Declared) -> dict[str, Any]:
    """The schema of `d`'s value: its type, bounds or choices, and its help."""
    if d.kind is Secret:
        raise ValueError(f"{d.label} is a secret: a chart sets it from a Secret, not a value")
    s = d.setting
    if d.kind is list:
        out: dict[str, Any] = {"type": "array", "items": {"type": "string"}}
    elif d.kind in (int, float, bool):
        out = {"type": _TYPES[d.kind]}
        bounds = {"minimum": s.ge, "exclusiveMinimum": s.gt, "maximum": s.le}
        bounds["exclusiveMaximum"] = s.lt
        out.update({k: _number(d, v) for k, v in bounds.items() if v is not None})
    elif d.choices:
        out = {"type": "string", "enum": ["", *d.choices]}
    elif d.kind in (str, Path):
        out = {"type": "string"}
        if s.pattern is not None:
            out["pattern"] = f"^(?:{s.pattern})?$"
    else:
        raise ValueError(f"{d.label}: no chart value for a {d.kind.__name__}")
    out["description"] = f"{d.flag}: {s.help}"
    return out


def _number(d: Declared, bound: float) -> float | int:
    return int(bound) if d.kind is int or float(bound).is_integer() else bound
