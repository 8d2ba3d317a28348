"""`splitserve decode`: run a decode node, or with `--role colocated` a node that prefills
and decodes alone (flags: node.cli)."""

from __future__ import annotations

import argparse

from node.cli import add_node_arguments, run_node
from node.settings import NodeSettings

ROLES = ("decode", "colocated")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_node_arguments(parser, roles=ROLES)


def run(args: argparse.Namespace) -> int:
    return run_node(args, ROLES[0], _create_app)  # --role picks another of ROLES


def _create_app(settings: NodeSettings) -> object:
    from decode_node.app import create_app  # torch loads here, after the flags parsed

    return create_app(settings)
