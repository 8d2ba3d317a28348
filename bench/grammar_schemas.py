"""Twenty JSON schemas with one valid instance each: nested objects, arrays, enums, bounded
numbers, required and optional fields. Strings and arrays are bounded so that constrained
outputs end within a few dozen tokens (the grammar benchmarks and the e2e tests use them)."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]


def _obj(props: dict[str, Schema], required: list[str] | None = None) -> Schema:
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
    }


_NAME: Schema = {"type": "string", "minLength": 1, "maxLength": 12}
_SHORT: Schema = {"type": "string", "maxLength": 8}

SCHEMAS: list[tuple[Schema, Any]] = [
    (_obj({"name": _NAME}), {"name": "Paris"}),
    (_obj({"age": {"type": "integer", "minimum": 0, "maximum": 120}}), {"age": 42}),
    (_obj({"ok": {"type": "boolean"}}), {"ok": True}),
    (_obj({"color": {"enum": ["red", "green", "blue"]}}), {"color": "green"}),
    (
        _obj(
            {
                "city": _NAME,
                "country": _NAME,
                "population": {"type": "integer", "minimum": 0, "maximum": 99999999},
            }
        ),
        {"city": "Paris", "country": "France", "population": 2100000},
    ),
    (
        _obj({"tags": {"type": "array", "items": _SHORT, "minItems": 1, "maxItems": 3}}),
        {"tags": ["a", "b"]},
    ),
    (
        _obj(
            {
                "scores": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 0, "maximum": 10},
                    "maxItems": 4,
                }
            }
        ),
        {"scores": [1, 2, 3]},
    ),
    (
        _obj(
            {
                "point": _obj(
                    {
                        "x": {"type": "integer", "minimum": -100, "maximum": 100},
                        "y": {"type": "integer", "minimum": -100, "maximum": 100},
                    }
                )
            }
        ),
        {"point": {"x": 1, "y": -2}},
    ),
    (
        _obj({"user": _obj({"name": _NAME, "admin": {"type": "boolean"}})}),
        {"user": {"name": "ann", "admin": False}},
    ),
    (
        _obj({"title": _NAME, "note": _SHORT}, required=["title"]),
        {"title": "x"},
    ),
    (
        _obj(
            {
                "status": {"enum": ["open", "closed"]},
                "count": {"type": "integer", "minimum": 1, "maximum": 9},
            }
        ),
        {"status": "open", "count": 3},
    ),
    (
        _obj({"ratio": {"type": "number", "minimum": 0, "maximum": 1}}),
        {"ratio": 0.5},
    ),
    (
        _obj(
            {
                "temperature": {"type": "number", "minimum": -50, "maximum": 50},
                "unit": {"enum": ["C", "F"]},
            }
        ),
        {"temperature": 21.5, "unit": "C"},
    ),
    (
        _obj(
            {
                "items": {
                    "type": "array",
                    "maxItems": 2,
                    "items": _obj(
                        {"id": {"type": "integer", "minimum": 0, "maximum": 999}, "label": _SHORT}
                    ),
                }
            }
        ),
        {"items": [{"id": 1, "label": "a"}]},
    ),
    (
        _obj(
            {
                "answer": {"enum": ["yes", "no", "maybe"]},
                "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
            },
            required=["answer"],
        ),
        {"answer": "yes", "confidence": 90},
    ),
    (
        _obj({"a": _obj({"b": _obj({"c": {"type": "integer", "minimum": 0, "maximum": 9}})})}),
        {"a": {"b": {"c": 7}}},
    ),
    (
        _obj(
            {
                "matrix": {
                    "type": "array",
                    "maxItems": 2,
                    "items": {
                        "type": "array",
                        "maxItems": 2,
                        "items": {"type": "integer", "minimum": 0, "maximum": 9},
                    },
                }
            }
        ),
        {"matrix": [[1, 2], [3]]},
    ),
    (
        _obj(
            {"level": {"type": "integer", "enum": [1, 2, 3]}, "flag": {"type": "boolean"}},
            required=["level"],
        ),
        {"level": 2},
    ),
    (
        _obj({"first": _NAME, "last": _NAME, "email": _NAME}, required=["first", "last"]),
        {"first": "Ada", "last": "Lovelace"},
    ),
    (
        {"type": "array", "minItems": 1, "maxItems": 3, "items": {"enum": ["up", "down"]}},
        ["up", "down"],
    ),
]
