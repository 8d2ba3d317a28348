"""The node command line: flags are NodeSettings fields, bad values and busy ports fail
before any model loads."""

from __future__ import annotations

import argparse
import socket

import pytest

from cluster.settings import NodeSettings
from node.cli import add_node_arguments, run_node, settings_from_args


def _parse(*argv: str, roles: tuple[str, ...] = ("decode", "colocated")) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_node_arguments(parser, roles)
    return parser.parse_args(list(argv))


def _never(settings: NodeSettings) -> object:
    raise AssertionError("the app must not be built")


def test_flags_become_settings() -> None:
    args = _parse(
        "--port", "9100", "--num-kv-blocks", "12", "--lease-ttl-s", "2.5",
        "--transfer", "tcp", "--role", "colocated", "--model-cache", "/m",
    )  # fmt: skip
    settings = settings_from_args(args, args.role)
    assert (settings.port, settings.num_kv_blocks, settings.lease_ttl_s) == (9100, 12, 2.5)
    assert (settings.transfer, settings.role, str(settings.model_cache)) == (
        "tcp",
        "colocated",
        "/m",
    )


def test_choices_come_from_the_settings() -> None:
    with pytest.raises(argparse.ArgumentError):
        _parse("--transfer", "carrier-pigeon")
    with pytest.raises(argparse.ArgumentError):
        _parse("--role", "prefill")  # the decode command serves decode and colocated
    parser = argparse.ArgumentParser()
    add_node_arguments(parser, ("prefill",))
    assert "--role" not in parser.format_help()


def test_bad_settings_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse("--heartbeat-s", "5", "--ttl-s", "1")
    assert run_node(args, "decode", _never) == 2
    assert "ttl_s" in capsys.readouterr().err


def test_a_busy_port_exits_1_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        args = _parse("--port", str(busy.getsockname()[1]))
        assert run_node(args, "decode", _never) == 1
    assert "cannot listen" in capsys.readouterr().err
