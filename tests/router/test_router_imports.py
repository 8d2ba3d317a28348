"""The router never loads torch or the engine in a running interpreter (tests/test_imports.py
checks the source); its CLI builds settings."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from router import cli
from router.app import route_paths

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("torch", "engine", "triton", "nixl", "nixl_cu12", "transformers", "kv_transfer",
             "prefill_node", "decode_node", "node")  # fmt: skip


def test_router_runs_without_torch_in_a_fresh_interpreter() -> None:
    code = """
import sys
from cluster.registry import StaticMembership
from router.settings import RouterSettings
from router.app import create_app, route_paths
import router.cli, router.flow.request_flow, router.api.streaming
create_app(RouterSettings(), membership=StaticMembership())
route_paths()
bad = sorted(m for m in sys.modules if m.split(".")[0] in FORBIDDEN)
print("FORBIDDEN:", bad)
sys.exit(1 if bad else 0)
"""
    result = subprocess.run(
        [sys.executable, "-c", f"FORBIDDEN = {FORBIDDEN!r}\n{code}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_route_paths_lists_the_api_and_the_probes() -> None:
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/ready",
            "/metrics"} <= route_paths()  # fmt: skip


def test_cli_refuses_invalid_settings(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    parser = argparse.ArgumentParser(exit_on_error=False)
    cli.add_arguments(parser)
    with pytest.raises(argparse.ArgumentError, match="--port: must be <= 65535, got 70000"):
        parser.parse_args(["--port", "70000"])
    monkeypatch.setenv("SPLITSERVE_PORT", "70000")
    assert cli.run(parser.parse_args(["--policy", "round_robin"])) == 2
    assert "port (--port, env SPLITSERVE_PORT): must be <= 65535" in capsys.readouterr().err
