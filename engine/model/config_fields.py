"""Typed reading of a Hugging Face ``config.json``: every error names the file and field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class Fields:
    """Typed access to a config dict; a missing or mistyped field names the file."""

    def __init__(self, raw: dict[str, Any], source: str) -> None:
        self.raw = raw
        self.source = source

    def integer(self, key: str, raw: dict[str, Any] | None = None) -> int:
        value = self._value(key, raw)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(f"{key!r} must be an integer, got {value!r}")
        return value

    def number(self, key: str, raw: dict[str, Any] | None = None) -> float:
        value = self._value(key, raw)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(f"{key!r} must be a number, got {value!r}")
        return float(value)

    def optional_integer(self, key: str, default: int) -> int:
        return self.integer(key) if self.has(key) else default

    def optional_number(self, key: str, default: float) -> float:
        return self.number(key) if self.has(key) else default

    def has(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def error(self, message: str) -> ValueError:
        return ValueError(f"{self.source}: {message}")

    def refuse(self, key: str, why: str) -> ValueError:
        """The one-line refusal of an option this engine does not build."""
        return self.error(f"{key}={self.raw.get(key)!r} is not supported ({why})")

    def _value(self, key: str, raw: dict[str, Any] | None) -> Any:
        value = (self.raw if raw is None else raw).get(key)
        if value is None:
            raise self.error(f"required field {key!r} is missing")
        return value


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def eos_ids(value: Any, source: str) -> set[int]:
    if value is None:
        return set()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{source}: eos_token_id must be an integer or a list, got {value!r}")
    return set(values)


def rotary_dims(fields: Fields, head_dim: int, default: float) -> int:
    """The dims of a head the rotary turns: ``partial_rotary_factor`` (in ``rope_parameters``
    or beside it) of ``head_dim``, rounded down as transformers does."""
    params = fields.raw.get("rope_parameters") or {}
    factor = params.get("partial_rotary_factor", fields.raw.get("partial_rotary_factor"))
    factor = default if factor is None else factor
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor <= 1:
        raise fields.error(f"'partial_rotary_factor' must be in (0, 1], got {factor!r}")
    dims = int(head_dim * factor)
    if dims % 2:
        raise fields.error(
            f"partial_rotary_factor={factor!r} turns {dims} dims of {head_dim}: must be even"
        )
    return dims
