"""The chart speaks the processes' language: every command line it renders parses with the real
`splitserve` subcommand, and every SPLITSERVE_* variable it sets is a setting that is read."""

from __future__ import annotations

import argparse
import importlib

import helm_python
import pytest
from helm_render import container_port, deployments, env_of, main_container, pod_spec, render

from config_kit import ENV_PREFIX, declared
from node.cli import settings_from_args
from node.settings import NodeSettings
from router.settings import RouterSettings

CLI_MODULES = {"router": "router.cli", "prefill": "prefill_node.cli", "decode": "decode_node.cli"}
SETTINGS: dict[str, type[RouterSettings] | type[NodeSettings]] = {
    "router": RouterSettings,
    "prefill": NodeSettings,
    "decode": NodeSettings,
}


def _parse(module_name: str, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="splitserve", exit_on_error=False)
    importlib.import_module(module_name).add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize("component", list(SETTINGS))
def test_env_vars_are_real_settings(component: str) -> None:
    env = env_of(main_container(deployments(render({"auth": {"apiKey": "k"}}))[component]))
    ours = [name for name in env if name.startswith(ENV_PREFIX)]
    assert ours
    variables = {d.env for d in declared(SETTINGS[component])}
    for name in ours:
        assert name in variables, f"{name} is read by nobody"


def test_model_pull_init_container_parses() -> None:
    init = pod_spec(deployments(render())["decode"])["initContainers"][0]
    command, *argv = init["args"]
    assert command == "model"
    args = _parse("models.cli", argv)
    assert (args.model_command, args.name, str(args.model_cache)) == ("pull", "smollm2", "/models")


@pytest.mark.parametrize("component", list(CLI_MODULES))
def test_command_line_parses_with_the_subcommand(component: str) -> None:
    container = main_container(deployments(render())[component])
    command, *argv = (str(a) for a in container["args"])
    assert command == component
    args = _parse(CLI_MODULES[component], argv)
    assert int(args.port) == container_port(container, "http")


@pytest.mark.parametrize("pool", ["prefill", "decode"])
def test_a_node_setting_is_a_pool_value(pool: str) -> None:
    """A key the chart's templates never name reaches the node as its flag."""
    values = {pool: {"loadFormat": "random", "maxNumSeqs": 8, "kvEvents": False}}
    container = main_container(deployments(render(values))[pool])
    command, *argv = (str(a) for a in container["args"])
    settings = settings_from_args(_parse(CLI_MODULES[command], argv), command)
    assert (settings.engine.load_format, settings.engine.max_num_seqs) == ("random", 8)
    assert settings.kv_events is False
    other = "decode" if pool == "prefill" else "prefill"
    assert "--load-format" not in main_container(deployments(render(values))[other])["args"]


def test_a_bad_setting_value_is_refused_by_the_schema() -> None:
    with pytest.raises(helm_python.HelmValuesError, match="/decode/loadFormat"):
        render({"decode": {"loadFormat": "dummy"}})
