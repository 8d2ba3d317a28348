"""Hypothesis strategies for request bodies from a pydantic model's JSON schema: values the
schema allows, and the same with one field broken (wrong type, out of range, unknown key,
missing required field). Covers the subset pydantic emits: objects, arrays, anyOf, enum,
const, $ref into $defs, numeric bounds and maxItems."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

Schema = dict[str, Any]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


def valid(schema: Schema, defs: dict[str, Schema], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values of `schema` (within its bounds)."""
    if "$ref" in schema:
        return valid(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, depth + 1)
    if "anyOf" in schema:
        return st.one_of([valid(s, defs, depth) for s in schema["anyOf"]])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "integer":
        return st.integers(schema.get("minimum", -(2**40)), schema.get("maximum", 2**40))
    if kind == "number":
        return _number(schema)
    if kind == "string":
        return st.text(max_size=schema.get("maxLength", 40))
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        items = valid(schema.get("items", {}), defs, depth + 1) if depth < 4 else JSON
        return st.lists(items, max_size=min(schema.get("maxItems", 4), 4))
    if kind == "object":
        return _object(schema, defs, depth)
    return JSON


def _number(schema: Schema) -> st.SearchStrategy[float]:
    low, high = schema.get("minimum"), schema.get("maximum")
    if "exclusiveMinimum" in schema:
        low = schema["exclusiveMinimum"]
    return st.floats(
        low, high, allow_nan=False, allow_infinity=False,
        exclude_min="exclusiveMinimum" in schema, exclude_max="exclusiveMaximum" in schema,
    )  # fmt: skip


def _object(schema: Schema, defs: dict[str, Schema], depth: int) -> st.SearchStrategy[Any]:
    props = schema.get("properties", {})
    required = set(schema.get("required", ()))
    fields = {k: valid(v, defs, depth + 1) for k, v in props.items()}
    base = st.fixed_dictionaries(
        {k: s for k, s in fields.items() if k in required},
        optional={k: s for k, s in fields.items() if k not in required},
    )
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        more = st.dictionaries(st.text(max_size=6), valid(extra, defs, depth + 1), max_size=3)
        return st.tuples(base, more).map(lambda pair: pair[1] | pair[0])
    return base


def broken(schema: Schema) -> st.SearchStrategy[Any]:
    """A valid body with one field replaced by junk, dropped, or an unknown key added."""
    defs = schema.get("$defs", {})
    fields = sorted(schema.get("properties", {}))

    def spoil(body: dict[str, Any], how: str, key: str, junk: Any) -> dict[str, Any]:
        body = dict(body)
        if how == "drop":
            body.pop(key, None)
        elif how == "unknown":
            body["x_" + key] = junk
        else:
            body[key] = junk
        return body

    return st.builds(
        spoil,
        valid(schema, defs),
        st.sampled_from(["junk", "drop", "unknown"]),
        st.sampled_from(fields),
        JSON | st.integers(-(2**70), 2**70) | st.floats(),
    )


def plausible(schema: Schema, base: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """`base` (a request the router serves) plus a few optional fields with schema values."""
    defs = schema.get("$defs", {})
    fields = {k: valid(v, defs) for k, v in schema["properties"].items() if k not in base}
    some = st.lists(st.sampled_from(sorted(fields)), max_size=4, unique=True)
    extra = some.flatmap(lambda names: st.fixed_dictionaries({n: fields[n] for n in names}))
    return extra.map(lambda more: more | base)


def bodies(schema: Schema, model: str, base: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Request bodies: plausible, valid and broken ones (mostly naming `model`), and
    non-objects."""
    defs = schema.get("$defs", {})

    def name_model(body: Any, use: bool) -> Any:
        if use and isinstance(body, dict) and "model" in body:
            return body | {"model": model}
        return body

    objects = st.one_of(valid(schema, defs), broken(schema))
    return st.one_of(plausible(schema, base), st.builds(name_model, objects, st.booleans()), JSON)
