"""The chart's generated files follow the declarations: values.schema.json and
files/settings.json are what `python -m launcher.helm_schema --write` writes, a declaration
that changes makes the check fail, and a key renders as its flag."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from config_kit import declare
from launcher import helm_schema

ROOT = Path(__file__).resolve().parents[2]


def test_the_chart_files_are_the_declarations() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "launcher.helm_schema"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_changed_declaration_is_a_stale_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    """Narrow kv_events_maxlen's bounds: the written schema no longer matches."""
    maxlen = next(
        d
        for d in helm_schema.chart_settings(helm_schema.NodeSettings)
        if d.name == "kv_events_maxlen"
    )
    narrowed = dataclasses.replace(maxlen, setting=dataclasses.replace(maxlen.setting, ge=64))
    real = declare.declared

    def declared(cls: type) -> tuple[declare.Declared, ...]:
        return tuple(narrowed if d == maxlen else d for d in real(cls))

    monkeypatch.setattr(helm_schema, "declared", declared)
    schema = json.loads(helm_schema.expected()[helm_schema.SCHEMA])
    key = schema["definitions"]["nodeSettings"]["properties"]["kvEventsMaxlen"]
    assert key["minimum"] == 64
    assert helm_schema.main([]) == 1


def test_each_pool_and_the_router_refer_to_their_generated_keys() -> None:
    schema = json.loads(helm_schema.SCHEMA.read_text())
    pool = schema["definitions"]["pool"]["properties"]
    assert pool["maxNumSeqs"] == {"$ref": "#/definitions/nodeSettings/properties/maxNumSeqs"}
    router = schema["properties"]["router"]["properties"]
    assert router["maxInflight"] == {"$ref": "#/definitions/routerSettings/properties/maxInflight"}
    flags = json.loads(helm_schema.SETTINGS.read_text())
    assert flags["node"]["float32MatmulPrecision"] == "--float32-matmul-precision"
    assert "port" not in flags["router"] and "clusterToken" not in flags["node"]  # the chart's
