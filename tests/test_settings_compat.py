"""The flags and SPLITSERVE_* variables users had before the settings kit still work with the
same meaning: tests/settings_before.json lists every flag of `splitserve up`, `router`,
`prefill`, `decode` and `planner` and every variable the router and the nodes read, as of
commit 56c2389, and every flag of `generate` as of 6f08e08 (which gave it the nodes' engine
flags), each with a sample value and what it changed (the settings of the process, of each
child `up` starts, or what `generate` hands the engine), written by running each with the code
of that commit. Every flag and variable the user's pages name is one a command takes or a
process reads."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any

import pytest

from config_kit import Secret, declared, given_flags, load
from engine import cli as generate_cli
from engine.config import EngineConfig
from launcher import cli, up_plan
from node.cli import settings_from_args
from node.settings import NodeSettings
from planner.settings import PlannerSettings
from router.settings import RouterSettings

ROOT = Path(__file__).resolve().parents[1]
BEFORE = json.loads((ROOT / "tests" / "settings_before.json").read_text())
CLASSES: dict[str, type] = {"router": RouterSettings, "node": NodeSettings}
# variables that are no component's setting: read by the CPU kernels' build (engine.cpu_kernels),
# handed from `up` to a child (cluster.listen), or the tests' own
OTHER_VARIABLES = {
    "SPLITSERVE_CPU_KERNELS", "SPLITSERVE_KERNEL_CACHE", "SPLITSERVE_CPU_VEC_WIDTH",
    "SPLITSERVE_AMX_EMULATE",
    "SPLITSERVE_LISTEN_FD", "SPLITSERVE_CHROMIUM", "SPLITSERVE_TEST_MODEL_DIR",
}  # fmt: skip
# named in prose: an abbreviation shown refused (commands.md), docker build's (helm.md), the
# GPU check's (gpu.md)
NOT_FLAGS = {"--kv-offload-cpu", "--build-arg", "--list", "--only"}


def plain(value: Any) -> Any:
    """A value as the snapshot wrote it (JSON)."""
    if isinstance(value, Secret):
        return value.get_secret_value()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def flat(settings: Any) -> dict[str, Any]:
    """Public name -> value of every setting; a part's not given stays its component's
    default (the engine's depends on the device), NOT_GIVEN here."""
    out = {}
    for d in declared(type(settings)):
        if d.part:
            out[d.name] = plain(getattr(settings, d.part).values.get(d.field, NOT_GIVEN))
        else:
            out[d.name] = plain(getattr(settings, d.field))
    return out


NOT_GIVEN = "(the component's default)"


def parse(command: str, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    cli.COMMANDS[command][0]().add_arguments(parser)
    return parser.parse_args(argv)


def node_meaning(command: str, argv: list[str], role: str | None = None) -> dict[str, Any]:
    return flat(settings_from_args(parse(command, argv), role or command))


def router_meaning(argv: list[str]) -> dict[str, Any]:
    return flat(load(RouterSettings, given_flags(parse("router", argv), RouterSettings)))


def planner_meaning(argv: list[str]) -> dict[str, Any]:
    settings = load(PlannerSettings, given_flags(parse("planner", argv), PlannerSettings))
    config = settings.config.build()
    out: dict[str, Any] = {f"config.{k}": getattr(config, k) for k in PLANNER_CONFIG}
    for pool in ("prefill", "decode"):
        limits = getattr(config, pool)
        out[f"config.{pool}.min_replicas"] = limits.min_replicas
        out[f"config.{pool}.max_replicas"] = limits.max_replicas
    keys = ("redis_url", "router_url", "prometheus_url", "host", "port", "log_level")
    return out | {k: plain(getattr(settings, k)) for k in keys}


PLANNER_CONFIG = (
    "ttft_slo_s", "itl_slo_s", "interval_s", "horizon_intervals", "scale_down_intervals",
    "up_cooldown_s", "down_cooldown_s", "start_timeout_s",
)  # fmt: skip


def up_meaning(argv: list[str]) -> dict[str, Any]:
    args = parse("up", argv)
    model, redis = Path("/models/m"), "redis://h:1/0"
    out: dict[str, Any] = {}
    plans = up_plan.plan_nodes(args)
    try:
        for plan in plans:
            child = up_plan.node_argv(args, model, redis, plan)
            out[plan.name] = node_meaning(child[3], child[4:], plan.role)
            del out[plan.name]["port"]  # the kernel's pick
    finally:
        for plan in plans:
            if plan.listener is not None:
                plan.listener.close()
    out["router"] = router_meaning(up_plan.router_argv(args, model, redis)[4:])
    if env := up_plan.router_environment(args, {}):
        out["router-env"] = env
    if args.planner:
        out["planner"] = planner_meaning(up_plan.planner_argv(args, redis, 9999)[4:])
    out["up"] = plain(vars(args))
    return out


def generate_meaning(argv: list[str]) -> dict[str, Any]:
    """What `generate` hands the engine (LLM's keyword arguments, its dtype and device
    defaults written out), and its other flags."""
    args = parse("generate", ["a prompt", *argv])
    engine = {"dtype": "float32", "device": "cpu"} | generate_cli._llm_options(args)
    names = {d.name for d in declared(EngineConfig)} | {"prompts"}
    return plain(engine | {k: v for k, v in vars(args).items() if k not in names})


def meaning(command: str, argv: list[str]) -> dict[str, Any]:
    if command == "generate":
        return generate_meaning(argv)
    if command == "up":
        return up_meaning(argv)
    if command == "router":
        return router_meaning(argv)
    if command == "planner":
        return planner_meaning(argv)
    return node_meaning(command, argv)


def changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in after.items() if before.get(k) != v}


def flag_cases() -> Iterator[Any]:
    for command, flags in BEFORE["commands"].items():
        for flag, case in flags.items():
            yield pytest.param(command, case, id=f"{command} {flag}")


@pytest.mark.parametrize(("command", "case"), flag_cases())
def test_a_flag_users_had_means_what_it_meant(command: str, case: dict[str, Any]) -> None:
    base = ["--router-url", "http://r:8000"] if command == "planner" else []
    extra = case["extra"]
    try:
        before = meaning(command, extra or base)
    except Exception:
        before = meaning(command, base)
    after = meaning(command, case["argv"])
    if command != "up":
        assert changes(before, after) == case["meaning"]
        return
    for child, fields in case["meaning"].items():  # up: what each child it starts gets
        if child in ("up", "router-env", "planner"):
            got = after[child]
        else:  # a node the plan without the flag lacks: against its pool's first
            pool = "prefill-0" if child.startswith("prefill") else "decode-0"
            got = changes(before.get(child, before[pool]), after[child])
        assert {k: got.get(k) for k in fields} == fields, child


def variable_cases() -> Iterator[Any]:
    for variable, readers in BEFORE["environment"].items():
        for component, case in readers.items():
            yield pytest.param(variable, component, case, id=f"{variable} {component}")


def _settings_of(component: str) -> dict[str, Any]:
    if component == "planner":
        return flat(load(PlannerSettings, router_url=["http://r:8000"]))
    return flat(load(CLASSES[component]))


@pytest.mark.parametrize(("variable", "component", "case"), variable_cases())
def test_a_variable_users_had_means_what_it_meant(
    variable: str, component: str, case: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in __import__("os").environ if n.startswith("SPLITSERVE_")]:
        monkeypatch.delenv(name)
    for name, value in case["needs"].items():
        monkeypatch.setenv(name, value)
    try:
        before = _settings_of(component)
    except Exception:
        for name in case["needs"]:
            monkeypatch.delenv(name)
        before = _settings_of(component)
        for name, value in case["needs"].items():
            monkeypatch.setenv(name, value)
    monkeypatch.setenv(variable, case["value"])
    after = _settings_of(component)
    assert {k: after[k] for k in case["meaning"]} == case["meaning"]
    assert changes(before, after).keys() <= case["meaning"].keys() | case["needs"].keys()


OTHER_TOOL = re.compile(r"\b(helm|pip|docker|kubectl) |python -m |\bbench\.\w+ --")


def documented() -> Iterator[tuple[str, str | None, str]]:
    """(flag or variable, the subcommand the line names, page) of every one the user's pages
    name (the README and every page of docs/ but the benchmarks', whose flags are the
    scripts'), but on lines that run another tool (helm, pip, docker, a benchmark script)."""
    pages = sorted((ROOT / "docs").rglob("*.md"))
    for page in [ROOT / "README.md", *(p for p in pages if "benchmarks" not in p.parts)]:
        other = False  # a line of another tool's command (continued with a backslash too)
        for line in page.read_text().splitlines():
            other = bool(OTHER_TOOL.search(line)) or other
            if other:
                other = line.rstrip().endswith("\\")
                continue
            command = re.search(r"splitserve (\w+)", line)
            for word in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*|SPLITSERVE_[A-Z0-9_]+", line):
                yield word, command[1] if command else None, str(page.relative_to(ROOT))


def flags_of(parser: argparse.ArgumentParser) -> set[str]:
    """Every flag of a parser and of its subcommands' parsers."""
    out = {s for a in parser._actions for s in a.option_strings}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= flags_of(sub)
    return out


def test_every_flag_and_variable_the_docs_name_is_taken() -> None:
    commands = {name: flags_of(cli._build_parser([name])) for name in cli.COMMANDS}
    everywhere = set().union(*commands.values())
    variables = {d.env for c in (*CLASSES.values(), PlannerSettings) for d in declared(c)}
    unknown = []
    for word, command, page in documented():
        if word in NOT_FLAGS:
            continue
        if word.startswith("SPLITSERVE_"):
            ok = word in variables | OTHER_VARIABLES or word.endswith("_")  # a family: KV_*
        elif word.endswith("-"):  # a family: --prefill-*, --min-*
            ok = any(flag.startswith(word) for flag in everywhere)
        else:
            ok = word in commands.get(command or "", everywhere) or word in everywhere
        if not ok:
            unknown.append(f"{page}: {word} ({command})")
    assert unknown == []
