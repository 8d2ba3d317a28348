"""Function tools as the harmony format declares them: a TypeScript-like `functions`
namespace in the developer message.

Each function is `type NAME = (_: {...}) => any;` (`() => any` without parameters), its
description as `//` comment lines above it and a blank line after it. A parameter object's
fields are `name: type,` (`name?:` when not required), a field's description as a comment
line above it and its default as `// default: ...` after it. JSON schema types map to
`string`, `number` (integer too), `boolean`, `null`, `T[]`, nested `{...}` objects, `object`
(an object without properties), unions (`anyOf`, `oneOf`, a list of types) joined by ` | `,
and `enum` / `const` values written as JSON literals; anything else is `any`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from router.api.requests import ToolDefinition

_SCALARS = {
    "string": "string", "number": "number", "integer": "number", "boolean": "boolean",
    "null": "null",
}  # fmt: skip


def functions_namespace(tools: Sequence[ToolDefinition]) -> str:
    """The `## functions` section of the developer message's `# Tools`."""
    body = "".join(_function(t) + "\n\n" for t in tools)
    return f"## functions\n\nnamespace functions {{\n\n{body}}} // namespace functions"


def _function(tool: ToolDefinition) -> str:
    fn = tool.function
    params = fn.parameters or {}
    head = _comment(fn.description)
    if not params.get("properties"):
        return f"{head}type {fn.name} = () => any;"
    return f"{head}type {fn.name} = (_: {_object(params)}) => any;"


def ts_type(schema: Any) -> str:
    """The TypeScript-like type of a JSON schema."""
    if not isinstance(schema, Mapping):
        return "any"
    if "enum" in schema and isinstance(schema["enum"], list):
        return " | ".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"]) or "any"
    if "const" in schema:
        return json.dumps(schema["const"], ensure_ascii=False)
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return " | ".join(ts_type(s) for s in schema[key]) or "any"
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(ts_type({**schema, "type": k}) for k in kind) or "any"
    if kind in _SCALARS:
        return _SCALARS[kind]
    if kind == "array":
        item = ts_type(schema.get("items"))
        return f"({item})[]" if " | " in item else f"{item}[]"
    if kind == "object" or "properties" in schema:
        return _object(schema) if schema.get("properties") else "object"
    return "any"


def _object(schema: Mapping[str, Any]) -> str:
    props = schema.get("properties")
    required = schema.get("required") or []
    fields = props.items() if isinstance(props, Mapping) else []
    return "{\n" + "".join(_field(n, p, n in required) for n, p in fields) + "}"


def _field(name: str, schema: Any, required: bool) -> str:
    spec = schema if isinstance(schema, Mapping) else {}
    line = f"{name}{'' if required else '?'}: {ts_type(spec)},"
    if "default" in spec:
        default = spec["default"]
        shown = default if isinstance(default, str) else json.dumps(default, ensure_ascii=False)
        line += f" // default: {shown}"
    return _comment(spec.get("description")) + line + "\n"


def _comment(text: object) -> str:
    if not isinstance(text, str) or not text.strip():
        return ""
    return "".join(f"// {line}\n" for line in text.strip().splitlines())
