"""Structured outputs: `response_format` (and forced tool calls) compiled to an llguidance
grammar once, in the router, and sent to the nodes in SamplingParams.grammar.

llguidance does not load torch, so the router checks a schema where the request arrives: a
schema it cannot compile is a 400 naming the parameter, before any node sees the request.
JSON is generated compact (no free whitespace), so that a model cannot spend its tokens on
blank lines. `json_object` also adds JSON_OBJECT_INSTRUCTION to the system message, as other
servers do: the grammar alone lets a model that was not asked for JSON close the object at
once (`{}`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import llguidance

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

from router.errors import APIError, bad_request

JSON_OBJECT_INSTRUCTION = (
    "Answer with one JSON object only, with the keys and values the answer needs."
)
_JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}
MAX_SCHEMA_BYTES = 64 * 1024


def json_schema_grammar(schema: Any, param: str) -> str:
    """The grammar of JSON matching `schema`, or a 400 naming `param` when it is not one."""
    if not isinstance(schema, dict):
        raise bad_request(
            f"invalid '{param}': a JSON schema must be an object, got {type(schema).__name__}",
            param=param,
            code="invalid_schema",
        )
    if len(json.dumps(schema)) > MAX_SCHEMA_BYTES:
        raise bad_request(
            f"invalid '{param}': the schema exceeds {MAX_SCHEMA_BYTES} bytes",
            param=param,
            code="invalid_schema",
        )
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
        problem = llguidance.LLMatcher.validate_grammar(grammar)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # a Rust panic surfaces as a BaseException: still client input
        problem = str(exc) or type(exc).__name__
    if problem:
        raise _invalid(param, problem)
    return grammar


def response_format_grammar(response_format: Any) -> str | None:
    """The grammar of a validated `response_format` (None for text)."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return json_schema_grammar({"type": "object"}, "response_format")
    spec = response_format.json_schema
    schema = spec.schema_ if spec.schema_ is not None else {"type": "object"}
    return json_schema_grammar(schema, "response_format.json_schema.schema")


def response_format_instruction(response_format: Any) -> str | None:
    """What the prompt's system message says for `response_format` (json_object only)."""
    if response_format is not None and response_format.type == "json_object":
        return JSON_OBJECT_INSTRUCTION
    return None


def _invalid(param: str, problem: str) -> APIError:
    problem = problem.strip().splitlines()[0][:300] if problem.strip() else "unknown error"
    return bad_request(f"invalid '{param}': {problem}", param=param, code="invalid_schema")
