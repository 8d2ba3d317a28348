"""The grammar of a forced tool call ends: a parameters schema that leaves objects open, strings
and arrays unbounded (what most users write) still gives a grammar that accepts no extra key
and no endless string, while every call it accepts validates against the schema as written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import llguidance
import pytest

from router.api.requests import ToolDefinition
from router.api.structured import json_schema_grammar
from router.api.tool_schema import MAX_ARRAY_ITEMS, MAX_STRING_CHARS, closed_schema
from router.api.tools import call_schema

OPEN = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"enum": ["C", "F"]},
        "days": {"type": "array", "items": {"type": "integer"}},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
    },
    "required": ["city"],
}


def _matcher(default_model_dir: Path, schema: dict[str, Any]) -> Any:
    tok = llguidance.LLTokenizer((default_model_dir / "tokenizer.json").read_text())
    grammar = json_schema_grammar(schema, "tools")

    def accepts(text: str) -> bool:
        matcher = llguidance.LLMatcher(tok, grammar)
        return matcher.consume_tokens(tok.tokenize_str(text)) and matcher.is_accepting()

    return accepts


def test_open_objects_close_and_free_strings_and_arrays_get_bounds() -> None:
    closed = closed_schema(OPEN)
    assert closed["additionalProperties"] is False
    props = closed["properties"]
    assert props["city"]["maxLength"] == MAX_STRING_CHARS
    assert props["days"]["maxItems"] == MAX_ARRAY_ITEMS
    assert props["where"]["additionalProperties"] is False
    assert "maxLength" not in props["unit"]
    assert OPEN["properties"]["city"] == {"type": "string"}  # the input is not changed


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "additionalProperties": {"type": "integer"}},  # said open: stays
        {"type": "object", "properties": {"a": {}}, "required": ["a", "b"]},  # b from elsewhere
        {"type": "object", "properties": {"a": {}}, "minProperties": 2},
        {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]},
    ],
)
def test_objects_whose_keys_come_from_elsewhere_stay_open(schema: dict[str, Any]) -> None:
    closed = closed_schema(schema)
    assert closed.get("additionalProperties") == schema.get("additionalProperties")
    for branch in closed.get("allOf", []):
        assert "additionalProperties" not in branch


def test_nothing_under_not_changes() -> None:
    banned = {"type": "object", "properties": {"b": {"type": "string"}}}
    schema = {"type": "object", "properties": {"a": {"not": banned}}}
    closed = closed_schema(schema)
    assert closed["properties"]["a"]["not"] == banned  # narrowing it would widen `a`
    assert closed["additionalProperties"] is False


def test_stated_bounds_are_kept() -> None:
    schema = {
        "type": "object",
        "properties": {
            "s": {"type": "string", "maxLength": 2000},
            "p": {"type": "string", "pattern": "^[a-z]+$"},
            "long": {"type": "string", "minLength": 600},
            "a": {"type": "array", "maxItems": 100},
        },
    }
    props = closed_schema(schema)["properties"]
    assert props["s"]["maxLength"] == 2000 and "maxLength" not in props["p"]
    assert props["long"]["maxLength"] == 600  # never below what the schema requires
    assert props["a"]["maxItems"] == 100


def test_the_forced_call_grammar_refuses_extra_keys_and_endless_strings(
    default_model_dir: Path,
) -> None:
    tool = ToolDefinition.model_validate(
        {"type": "function", "function": {"name": "get_weather", "parameters": OPEN}}
    )
    accepts = _matcher(default_model_dir, call_schema([tool]))

    def call(arguments: dict[str, Any]) -> str:
        return json.dumps({"name": "get_weather", "arguments": arguments}, separators=(",", ":"))

    assert accepts(call({"city": "Paris", "unit": "C", "days": [1, 2], "where": {"lat": 2.5}}))
    assert not accepts(call({"city": "Paris", "country": "France"}))
    assert not accepts(call({"city": "Paris", "where": {"lat": 1, "lon": 2}}))
    assert not accepts(call({"city": "x" * (MAX_STRING_CHARS + 1)}))
    assert not accepts(call({"city": "P", "days": list(range(MAX_ARRAY_ITEMS + 1))}))


def test_every_call_the_narrowed_schema_accepts_validates_as_written() -> None:
    samples = [
        {"city": "Paris"},
        {"city": "Paris", "extra": 1},
        {"city": "x" * (MAX_STRING_CHARS + 1)},
        {"city": "P", "where": {"lat": 1, "lon": 2}},
    ]
    closed = closed_schema(OPEN)
    for value in samples:
        if jsonschema.Draft202012Validator(closed).is_valid(value):
            jsonschema.validate(value, OPEN)
    assert jsonschema.Draft202012Validator(closed).is_valid(samples[0])
    assert not any(jsonschema.Draft202012Validator(closed).is_valid(v) for v in samples[1:])
