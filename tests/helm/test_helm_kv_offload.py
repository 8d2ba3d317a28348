"""<pool>.kvOffload renders the node's KV tier flags and the disk tier's volume: an emptyDir
sized for the files by default, an existing claim when named; bad values fail the render."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

import helm_python
import pytest
from helm_render import deployments, main_container, render


def _pod(values: dict[str, object], role: str) -> tuple[argparse.Namespace, dict[str, Any]]:
    deployment = deployments(render(values))[role]
    container = main_container(deployment)
    command, *argv = (str(a) for a in container["args"])
    parser = argparse.ArgumentParser(exit_on_error=False)
    importlib.import_module(f"{command}_node.cli").add_arguments(parser)
    return parser.parse_args(argv), deployment["spec"]["template"]["spec"]


def _volume(spec: dict[str, Any]) -> dict[str, Any] | None:
    return next((v for v in spec["volumes"] if v["name"] == "kv-offload"), None)


def test_off_by_default() -> None:
    for role in ("prefill", "decode"):
        args, spec = _pod({}, role)
        assert (args.kv_offload_cpu_gb, args.kv_offload_disk_path) == (None, None)
        assert _volume(spec) is None


def test_host_and_disk_tiers_on_an_empty_dir() -> None:
    disk = {"enabled": True, "sizeGb": 2}
    args, spec = _pod({"decode": {"kvOffload": {"cpuGb": 4, "disk": disk}}}, "decode")
    assert (args.kv_offload_cpu_gb, args.kv_offload_disk_gb) == (4.0, 2.0)
    assert args.kv_offload_disk_path == Path("/var/cache/splitserve-kv")
    assert _volume(spec) == {"name": "kv-offload", "emptyDir": {"sizeLimit": "2112Mi"}}
    mounts = main_container({"spec": {"template": {"spec": spec}}})["volumeMounts"]
    assert {"name": "kv-offload", "mountPath": "/var/cache/splitserve-kv"} in mounts
    prefill_args, _ = _pod({"decode": {"kvOffload": {"cpuGb": 4}}}, "prefill")
    assert prefill_args.kv_offload_cpu_gb is None  # per pool


def test_disk_tier_on_a_claim() -> None:
    disk = {"enabled": True, "sizeGb": 50, "claimName": "kv-cache", "mountPath": "/kv"}
    args, spec = _pod({"prefill": {"kvOffload": {"cpuGb": 1, "disk": disk}}}, "prefill")
    assert args.kv_offload_disk_path == Path("/kv")
    assert _volume(spec) == {
        "name": "kv-offload",
        "persistentVolumeClaim": {"claimName": "kv-cache"},
    }


@pytest.mark.parametrize(
    ("kv", "error"),
    [
        ({"cpuGb": -1}, "kvOffload"),
        ({"cpuGb": 1, "disk": {"enabled": True, "sizeGb": 0}}, "kvOffload"),
        ({"cpuGb": 1, "disk": {"enabled": True, "mountPath": "relative"}}, "kvOffload"),
        ({"disk": {"enabled": True}}, "needs decode.kvOffload.cpuGb"),
    ],
)
def test_bad_values_fail_the_render(kv: dict[str, object], error: str) -> None:
    with pytest.raises((helm_python.HelmValuesError, helm_python.HelmError), match=error):
        render({"decode": {"kvOffload": kv}})
