"""The command line shared by `splitserve prefill` and `splitserve decode`, and the server
runner (uvicorn + uvloop).

Every flag overrides its SPLITSERVE_* environment variable; both are generated from the
declarations of node.settings.NodeSettings (config_kit). The listening socket is bound before the
model loads: a port in use fails at once, and calls that arrive while the node starts wait
in the socket's backlog instead of being refused.
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

from cluster.listen import listener
from cluster.log_format import configure_logging
from config_kit import SettingsError, add_flags, given_flags, load
from models import resolve_model
from node.settings import NodeSettings


def add_node_arguments(parser: argparse.ArgumentParser, roles: Sequence[str]) -> None:
    """The node flags; `--role` only when the command serves more than one role."""
    add_flags(parser, NodeSettings, command_choices=roles)


def settings_from_args(args: argparse.Namespace, role: str) -> NodeSettings:
    """NodeSettings from the environment and the flags (the command's `role` unless a flag
    chose another of its roles); SettingsError names bad values."""
    return load(NodeSettings, given_flags(args, NodeSettings), command=role)


def run_node(
    args: argparse.Namespace, role: str, app_factory: Callable[[NodeSettings], Any]
) -> int:
    """Parse settings, bind the port, check the model directories, build the app with
    `app_factory` and serve it until SIGINT / SIGTERM. Exit codes: 2 bad settings or model,
    1 port unavailable, 3 start failed, 4 the node stopped itself (a tensor-parallel rank
    died)."""
    try:
        settings = settings_from_args(args, role)
    except SettingsError as exc:
        print(exc, file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    try:
        sock = listener(settings.host, settings.port)
    except OSError as exc:
        print(f"cannot listen on {settings.host}:{settings.port}: {exc}", file=sys.stderr)
        return 1
    try:
        check_models(settings)
    except (ValueError, LookupError) as exc:
        sock.close()
        print(exc, file=sys.stderr)
        return 2
    return serve(app_factory(settings), sock, settings)


def check_models(settings: NodeSettings) -> None:
    """Resolve the model and the draft model before torch loads (a bad one: one line); a
    node that makes random weights needs none in the model directory."""
    weights = settings.engine.load_format != "random"
    resolve_model(settings.model, settings.model_cache, weights)
    if settings.engine.draft_model is not None:
        resolve_model(str(settings.engine.draft_model), settings.model_cache)


def serve(app: Any, sock: socket.socket, settings: NodeSettings) -> int:
    """Run `app` on `sock` with uvicorn and uvloop until SIGTERM / SIGINT, which drain the
    node (node.drain); 3 when its lifespan failed to start."""
    import uvicorn

    from node.drain import DrainingServer
    from node.server import begin_drain

    config = uvicorn.Config(
        app,
        loop="uvloop",
        lifespan="on",
        log_config=None,
        log_level=settings.log_level,
        access_log=False,
        timeout_graceful_shutdown=max(1, round(settings.drain_timeout_s)),
    )
    server = DrainingServer(config, lambda: begin_drain(app))
    app.state.node.exit_on_fatal = server.fail
    server.run(sockets=[sock])
    return server.exit_code if server.started else 3
