"""The chart's routing policy values reach the router: --policy and the kv_aware weights."""

from __future__ import annotations

import argparse

import pytest
from helm_render import deployments, env_of, main_container, render

from config_kit import load
from router.cli import add_arguments
from router.settings import RouterSettings


def _router(values: dict[str, object]) -> tuple[argparse.Namespace, dict[str, str]]:
    container = main_container(deployments(render(values))["router"])
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    _, *argv = (str(a) for a in container["args"])
    env = {name: str(var.get("value")) for name, var in env_of(container).items()}
    return parser.parse_args(argv), env


def test_the_default_is_kv_aware_with_the_settings_default_weights() -> None:
    args, env = _router({})
    assert args.policy == "kv_aware"
    weights = {k: v for k, v in env.items() if k.startswith("SPLITSERVE_KV_")}
    assert len(weights) == 5
    assert load(RouterSettings, environ=weights) == RouterSettings()


def test_policy_and_weights_are_values() -> None:
    router = {"policy": "round_robin", "kvAware": {"loadWeight": 0.5}}
    args, env = _router({"router": router})
    assert args.policy == "round_robin"
    assert float(env["SPLITSERVE_KV_LOAD_WEIGHT"]) == 0.5
    assert float(env["SPLITSERVE_KV_PREFIX_WEIGHT"]) == 1.0


def test_an_unknown_policy_is_refused_by_the_schema() -> None:
    with pytest.raises(Exception, match="/router/policy"):
        render({"router": {"policy": "random"}})
