"""lora.* renders multi-LoRA for the whole cluster: the same adapters on the router and on every
node of both pools, the nodes' slot and rank limits, and the adapters' volume in the nodes."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

import helm_python
import pytest
from helm_render import deployments, main_container, pod_spec, render

from config_kit import load
from node.cli import settings_from_args
from node.settings import NodeSettings
from router.settings import RouterSettings

ADAPTERS = [
    {"name": "sql", "path": "/adapters/sql"},
    {"name": "chat-fr", "path": "/models/adapters/fr"},
]
VALUES: dict[str, Any] = {
    "lora": {
        "enabled": True,
        "modules": ADAPTERS,
        "maxLoras": 3,
        "maxLoraRank": 32,
        "maxCpuLoras": 6,
        "volume": {"claimName": "adapters-pvc", "mountPath": "/adapters"},
    }
}
PAIRS = ["sql=/adapters/sql", "chat-fr=/models/adapters/fr"]


def _args(component: str, values: dict[str, Any]) -> argparse.Namespace:
    container = main_container(deployments(render(values))[component])
    command, *argv = (str(a) for a in container["args"])
    module = "router.cli" if command == "router" else f"{command}_node.cli"
    parser = argparse.ArgumentParser(exit_on_error=False)
    importlib.import_module(module).add_arguments(parser)
    return parser.parse_args(argv)


def _node(role: str, values: dict[str, Any]) -> NodeSettings:
    return settings_from_args(_args(role, values), role)


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_both_pools_serve_the_adapters(role: str) -> None:
    s = _node(role, VALUES)
    assert s.engine.enable_lora
    assert s.lora_modules == PAIRS
    assert (s.engine.max_loras, s.engine.max_lora_rank, s.engine.max_cpu_loras) == (3, 32, 6)


def test_the_router_knows_the_same_adapters() -> None:
    args = _args("router", VALUES)
    assert args.lora_modules == PAIRS
    assert load(RouterSettings, lora_modules=args.lora_modules).lora_modules == PAIRS


def test_off_by_default() -> None:
    for role in ("prefill", "decode"):
        s = _node(role, {})
        assert not s.engine.enable_lora and s.lora_modules == []
    assert _args("router", {}).lora_modules is None


def test_enabled_without_modules_loads_at_run_time() -> None:
    s = _node("decode", {"lora": {"enabled": True}})
    assert s.engine.enable_lora and s.lora_modules == [] and s.engine.max_cpu_loras is None
    assert _args("router", {"lora": {"enabled": True}}).lora_modules is None


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_adapter_volume_is_mounted_read_only(role: str) -> None:
    deployment = deployments(render(VALUES))[role]
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    claim = volumes["lora-adapters"]["persistentVolumeClaim"]
    assert claim == {"claimName": "adapters-pvc", "readOnly": True}
    mounts = {m["name"]: m for m in main_container(deployment)["volumeMounts"]}
    assert mounts["lora-adapters"]["mountPath"] == "/adapters"
    assert mounts["lora-adapters"]["readOnly"] is True


def test_no_volume_without_a_claim() -> None:
    deployment = deployments(render({"lora": {"enabled": True}}))["decode"]
    assert "lora-adapters" not in {v["name"] for v in pod_spec(deployment)["volumes"]}


def test_modules_without_enabled_fail() -> None:
    with pytest.raises(helm_python.HelmError, match=r"lora\.enabled"):
        render({"lora": {"modules": ADAPTERS}})


@pytest.mark.parametrize(
    "lora",
    [
        {"enabled": True, "modules": [{"name": "a=b", "path": "/x"}]},
        {"enabled": True, "modules": [{"name": "a", "path": "relative/dir"}]},
        {"enabled": True, "maxLoras": 0},
        {"enabled": True, "rank": 8},
    ],
)
def test_bad_values_fail_the_schema(lora: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmValuesError, match="lora"):
        render({"lora": lora})
