"""The schema a forced tool call's arguments are generated from: the function's parameters,
closed and bounded, so that the grammar always leads to the end of the call.

JSON Schema leaves an object open unless it says `"additionalProperties": false`, and most
users do not say it: the grammar then lets a model add keys until `max_tokens`. For the grammar
only (the arguments are still checked against the schema as written), as OpenAI's strict mode
does:
- an object that does not say whether it takes more keys takes none;
- a string without `maxLength` (and without enum, const, pattern or format) has at most
  MAX_STRING_CHARS characters, an array without `maxItems` at most MAX_ARRAY_ITEMS items.
Each change only narrows what the schema accepts, so every call the grammar allows validates
against the user's schema. Objects whose keys come from elsewhere (`allOf`, `$ref` siblings,
required keys that are not in `properties`) stay as written: closing them could leave no
valid call at all. Nothing under `not` changes (narrowing there would widen the schema).
"""

from __future__ import annotations

from typing import Any

MAX_STRING_CHARS = 512
MAX_ARRAY_ITEMS = 32

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SCHEMAS = (
    "items",
    "additionalProperties",
    "additionalItems",
    "contains",
    "then",
    "else",
    "unevaluatedItems",
)
_BOUNDED_STRING = ("enum", "const", "pattern", "format", "maxLength")


def closed_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with open objects closed and free strings and arrays bounded (a copy)."""
    return _narrow(schema, merged=False)


def _narrow(node: Any, merged: bool) -> Any:
    """`merged`: the node is a branch of an allOf, whose keys add up with its siblings'."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            out[key] = {name: _narrow(sub, False) for name, sub in node[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            out[key] = [_narrow(sub, False) for sub in node[key]]
    for key in _SCHEMAS:
        if key in node:
            out[key] = (
                [_narrow(s, False) for s in node[key]]
                if isinstance(node[key], list)
                else _narrow(node[key], False)
            )
    if isinstance(node.get("allOf"), list):
        out["allOf"] = [_narrow(sub, True) for sub in node["allOf"]]
    if not merged and _closable(node):
        out["additionalProperties"] = False
    kind = node.get("type")
    if kind == "string" and not any(k in node for k in _BOUNDED_STRING):
        out["maxLength"] = max(MAX_STRING_CHARS, _int(node.get("minLength")))
    if kind == "array" and "maxItems" not in node:
        out["maxItems"] = max(MAX_ARRAY_ITEMS, _int(node.get("minItems")))
    return out


def _closable(node: dict[str, Any]) -> bool:
    """An object schema that does not say whether it takes keys beyond `properties`, and
    whose valid values all keep satisfying it once closed."""
    kind = node.get("type")
    is_object = kind == "object" or "properties" in node
    if not is_object or isinstance(kind, list):
        return False
    if any(k in node for k in ("additionalProperties", "unevaluatedProperties", "allOf", "$ref")):
        return False
    properties = node.get("properties", {})
    if not isinstance(properties, dict):
        return False
    required = node.get("required", [])
    if not isinstance(required, list) or any(name not in properties for name in required):
        return False
    return _int(node.get("minProperties")) <= len(properties)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
