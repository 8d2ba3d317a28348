"""The node command line as the node tests drive it: parsed without exiting, and an app
factory that fails the test when a bad command line gets as far as building the app."""

from __future__ import annotations

import argparse

from cluster.settings import NodeSettings
from node.cli import add_node_arguments


def parse_decode_args(*argv: str) -> argparse.Namespace:
    """The decode / colocated node's flags, parsed (errors raise instead of exiting)."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_node_arguments(parser, ("decode", "colocated"))
    return parser.parse_args(list(argv))


def never_build(settings: NodeSettings) -> object:
    raise AssertionError("the app must not be built")
