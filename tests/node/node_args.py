"""The node command line as the node tests drive it: parsed without exiting, and an app
factory that fails the test when a bad command line gets as far as building the app."""

from __future__ import annotations

import argparse

import pytest

from node.cli import add_node_arguments, run_node
from node.settings import NodeSettings


def parse_decode_args(*argv: str) -> argparse.Namespace:
    """The decode / colocated node's flags, parsed (errors raise instead of exiting)."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_node_arguments(parser, ("decode", "colocated"))
    return parser.parse_args(list(argv))


def never_build(settings: NodeSettings) -> object:
    raise AssertionError("the app must not be built")


def refusal(argv: tuple[str, ...] | list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Why the decode command refuses `argv` before any model loads: a flag's value out of
    its bounds stops the parser (argparse exits 2), settings that do not go together stop
    the node (exit 2)."""
    try:
        args = parse_decode_args(*argv)
    except argparse.ArgumentError as exc:
        return str(exc)
    assert run_node(args, "decode", never_build) == 2
    return capsys.readouterr().err
