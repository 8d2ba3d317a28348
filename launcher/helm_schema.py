"""The Helm chart's part that the declarations generate: each node setting a key of both pools,
each router setting a key of `router` (camelCase of the flag), checked by values.schema.json and
handed on by the templates' one loop (splitserve.settingArgs) through files/settings.json.

`python -m launcher.helm_schema --write` rewrites both files; without --write it exits 1
when they differ from the declarations (tests/launcher/test_chart_from_declarations.py runs
it). Settings the chart sets itself (Helm.CHART: addresses, ports, secrets, the KV tiers'
volume...) have no key here; the rest of the schema is written by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from config_kit import Declared, Helm, declared
from config_kit.schema import value_schema
from node.settings import NodeSettings
from router.settings import RouterSettings

CHART = Path(__file__).resolve().parents[1] / "helm" / "splitserve"
SCHEMA = CHART / "values.schema.json"
SETTINGS = CHART / "files" / "settings.json"
# component -> (its settings, the definition its keys live in, where its values are)
COMPONENTS: dict[str, tuple[type, str, tuple[str, ...]]] = {
    "node": (NodeSettings, "nodeSettings", ("definitions", "pool")),
    "router": (RouterSettings, "routerSettings", ("properties", "router")),
}
GENERATED = "generated from the settings' declarations by python -m launcher.helm_schema --write"


def chart_settings(cls: type) -> list[Declared]:
    """`cls`'s settings that are chart values."""
    return [d for d in declared(cls) if d.setting.helm is Helm.VALUES]


def settings_file() -> dict[str, Any]:
    """files/settings.json: component -> {key: flag}, what splitserve.settingArgs hands on."""
    out: dict[str, Any] = {"$comment": GENERATED}
    for name, (cls, _, _) in COMPONENTS.items():
        out[name] = {d.helm_key: d.flag for d in chart_settings(cls)}
    return out


def updated_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with the generated definitions and, in each component's values, a reference
    to each of its keys (replacing the references a previous run wrote)."""
    for cls, definition, where in COMPONENTS.values():
        keys = {d.helm_key: value_schema(d) for d in chart_settings(cls)}
        schema["definitions"][definition] = {"$comment": GENERATED, "properties": keys}
        owner = schema[where[0]][where[1]]
        prefix = f"#/definitions/{definition}/"
        kept = {
            k: v for k, v in owner["properties"].items() if not v.get("$ref", "").startswith(prefix)
        }
        clash = sorted(set(kept) & set(keys))
        if clash:
            raise ValueError(f"{'/'.join(where)} has keys of its own named like settings: {clash}")
        refs = {k: {"$ref": f"{prefix}properties/{k}"} for k in keys}
        owner["properties"] = kept | refs
    return schema


def dumps(value: Any, indent: int = 0) -> str:
    """JSON as the chart writes it: what fits on a line of 100 stays on one."""
    flat = json.dumps(value, ensure_ascii=False)
    if not isinstance(value, dict | list) or indent + len(flat) <= 100 or not value:
        return flat
    pad = " " * (indent + 2)
    if isinstance(value, list):
        items = [pad + dumps(v, indent + 2) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
    items = [f"{pad}{json.dumps(k)}: {dumps(v, indent + 2)}" for k, v in value.items()]
    return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"


def expected() -> dict[Path, str]:
    """The generated files' text from the declarations."""
    schema = updated_schema(json.loads(SCHEMA.read_text()))
    return {SCHEMA: dumps(schema) + "\n", SETTINGS: dumps(settings_file()) + "\n"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__)
    parser.add_argument("--write", action="store_true", help="rewrite the files")
    args = parser.parse_args(argv)
    stale = [p for p, text in expected().items() if not p.exists() or p.read_text() != text]
    if args.write:
        for path, text in expected().items():
            path.write_text(text)
        return 0
    for path in stale:
        print(f"{path} differs from the declarations: run python -m launcher.helm_schema --write")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
