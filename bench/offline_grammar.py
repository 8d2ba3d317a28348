"""The constrained workload of `python -m bench.offline --compare-json-schema`: the JSON
schema every request writes, compiled into an llguidance grammar."""

from __future__ import annotations

# Every request of --compare-json-schema writes this: an array of at least 64 small records,
# so that the grammar stays live for the whole fixed-length output (it cannot close early).
BENCH_SCHEMA = {
    "type": "array",
    "minItems": 64,
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        },
        "required": ["name", "age"],
    },
}


def bench_grammar() -> str:
    import llguidance

    return llguidance.LLMatcher.grammar_from_json_schema(
        BENCH_SCHEMA, defaults={"whitespace_flexible": False}
    )
