"""`splitserve prefill`: run a prefill node (flags: node.cli)."""

from __future__ import annotations

import argparse

from node.cli import add_node_arguments, run_node
from node.settings import NodeSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_node_arguments(parser, roles=("prefill",))


def run(args: argparse.Namespace) -> int:
    return run_node(args, "prefill", _create_app)


def _create_app(settings: NodeSettings) -> object:
    from prefill_node.app import create_app  # torch loads here, after the flags parsed

    return create_app(settings)
