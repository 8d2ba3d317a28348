"""The settings kit on a small config of its own: what a declaration generates (flags,
variables, checks), and errors that name the setting with its flag and variable."""

from __future__ import annotations

import argparse
from dataclasses import FrozenInstanceError, dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from config_kit import (
    Given,
    Secret,
    SettingError,
    SettingsError,
    add_flags,
    build,
    check_fields,
    given_flags,
    load,
    part,
    setting,
)


@dataclass(frozen=True)
class Engine:
    block_size: int = setting(16, "tokens per block", ge=1, le=1024)
    dtype: str = setting("float32", "dtype", choices=("float32", "bfloat16"))
    spare: int = 3  # not a setting: no flag, no variable

    def __post_init__(self) -> None:
        check_fields(self)
        self.check_relations(self)

    @staticmethod
    def check_relations(config: Any) -> None:
        if config.dtype == "bfloat16" and config.block_size > 64:
            raise ValueError("bfloat16 takes blocks of 64 tokens at most")


@dataclass(frozen=True)
class Server:
    port: int = setting(8000, "port", ge=1, le=65535)
    policy: Literal["fair", "fast"] = setting("fair", "policy")
    cache: Path | None = setting(None, "cache dir", deprecated=("cache_dir",))
    token: Secret | None = setting(None, "token")
    modules: list[str] = setting(help="name=path", factory=list)
    events: bool = setting(True, "publish events")
    transport: str = setting("auto", "transport", name="transfer", aliases=("xfer",))
    engine: Given[Engine] = part(Engine)

    def __post_init__(self) -> None:
        check_fields(self)


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_flags(parser, Server)
    return parser.parse_args(list(argv))


def test_the_environment_is_read_and_flags_win() -> None:
    env = {"SPLITSERVE_PORT": "9001", "SPLITSERVE_POLICY": "fast", "SPLITSERVE_BLOCK_SIZE": "8"}
    server = load(Server, given_flags(_parse("--port", "9002"), Server), environ=env)
    assert (server.port, server.policy, server.engine.block_size) == (9002, "fast", 8)
    assert server.engine.values == {"block_size": 8}  # the rest keeps Engine's defaults
    assert server.engine.build(spare=4) == Engine(block_size=8, spare=4)


def test_every_kind_of_value_reads_from_a_flag_and_a_variable(tmp_path: Path) -> None:
    argv = ["--cache", str(tmp_path), "--token", "t0p-secret", "--modules", "a=/x", "b=/y"]
    argv += ["--no-events", "--xfer", "tcp", "--dtype", "bfloat16"]
    server = load(Server, given_flags(_parse(*argv), Server), environ={})
    env = {"SPLITSERVE_CACHE": str(tmp_path), "SPLITSERVE_TOKEN": "t0p-secret"}
    env |= {"SPLITSERVE_MODULES": '["a=/x", "b=/y"]', "SPLITSERVE_EVENTS": "false"}
    env |= {"SPLITSERVE_TRANSFER": "tcp", "SPLITSERVE_DTYPE": "bfloat16"}
    assert load(Server, environ=env) == server
    assert (server.cache, server.modules, server.events) == (tmp_path, ["a=/x", "b=/y"], False)
    assert server.transport == "tcp" and server.engine.dtype == "bfloat16"
    assert server.token == Secret("t0p-secret") and "t0p" not in repr(server)


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"port": 70000}, "port (--port, env SPLITSERVE_PORT): must be <= 65535, got 70000"),
        ({"policy": "random"}, "policy (--policy, env SPLITSERVE_POLICY): must be one of fair"),
        ({"block_size": 0}, "block_size (--block-size, env SPLITSERVE_BLOCK_SIZE): must be >= 1"),
        ({"transfer": 3}, "transfer (--transfer, env SPLITSERVE_TRANSFER): must be a text"),
        ({"dtype": "bfloat16", "block_size": 128}, "bfloat16 takes blocks of 64 tokens at most"),
    ],
)
def test_a_bad_value_names_the_setting_its_flag_and_its_variable(
    values: dict[str, Any], named: str
) -> None:
    with pytest.raises(SettingsError, match="invalid Server") as err:
        build(Server, **values)
    assert named in str(err.value)


def test_a_bad_variable_is_named() -> None:
    with pytest.raises(SettingsError, match="SPLITSERVE_PORT: must be an integer, got 'many'"):
        load(Server, environ={"SPLITSERVE_PORT": "many"})


def test_a_flag_outside_its_bounds_stops_the_parser() -> None:
    with pytest.raises(argparse.ArgumentError, match="--block-size: must be >= 1, got 0"):
        _parse("--block-size", "0")
    with pytest.raises(argparse.ArgumentError, match="--policy: must be one of fair, fast"):
        _parse("--policy", "random")


def test_a_deprecated_name_works_with_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    assert _parse("--cache-dir", "/c").cache == Path("/c")
    assert "--cache-dir is deprecated; use --cache" in capsys.readouterr().err
    parser = argparse.ArgumentParser()
    add_flags(parser, Server)
    assert "--cache-dir" not in parser.format_help() and "--xfer" in parser.format_help()


def test_configs_are_frozen_and_fields_not_declared_are_no_flags() -> None:
    server = Server()
    with pytest.raises(FrozenInstanceError):
        server.port = 1  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        server.engine.values = {}  # type: ignore[misc]
    parser = argparse.ArgumentParser()
    add_flags(parser, Server)
    assert parser.parse_known_args(["--spare", "4"])[1] == ["--spare", "4"]
    with pytest.raises(SettingError, match=r"Engine\.block_size must be <= 1024"):
        Engine(block_size=4096)
