"""`splitserve router`: run the OpenAI-compatible router (uvicorn + uvloop).

Flags override SPLITSERVE_* environment variables, both generated from the declarations of
router.settings.RouterSettings; prefer SPLITSERVE_API_KEY over --api-key, which other users
can see in the process list.
"""

from __future__ import annotations

import argparse
import sys

from cluster.listen import listener
from cluster.log_format import configure_logging
from config_kit import SettingsError, add_flags, given_flags, load
from router.settings import RouterSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, RouterSettings)


def run(args: argparse.Namespace) -> int:
    try:
        settings = load(RouterSettings, given_flags(args, RouterSettings))
    except SettingsError as exc:
        print(exc, file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    try:
        sock = listener(settings.host, settings.port)
    except OSError as exc:
        print(f"cannot listen on {settings.host}:{settings.port}: {exc}", file=sys.stderr)
        return 1
    import uvicorn

    from router.app import create_app

    config = uvicorn.Config(
        create_app(settings),
        loop="uvloop",
        log_config=None,
        log_level=settings.log_level,
        access_log=False,
        timeout_graceful_shutdown=max(1, round(settings.drain_timeout_s)),
    )
    uvicorn.Server(config).run(sockets=[sock])
    return 0
