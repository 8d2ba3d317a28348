"""`splitserve model pull|list|path`: get models into the local cache and find them."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType

import models
from config_kit import add_flags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `model` subcommands to `parser`."""
    sub = parser.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    pull = sub.add_parser("pull", help="download and convert a registry model into the cache")
    pull.add_argument(
        "name", nargs="?", default=models.DEFAULT_MODEL, help="registry name (default: %(default)s)"
    )
    pull.add_argument("--quiet", action="store_true", help="print only the model directory")
    lst = sub.add_parser("list", help="registry models, pulled or not, and their directories")
    path = sub.add_parser("path", help="print the directory of a pulled model")
    path.add_argument("name", help="registry name or path to a HF directory")
    for p in (pull, lst, path):
        add_flags(p, models.ModelCache)


def _cache(args: argparse.Namespace) -> Path | None:
    return Path(args.model_cache) if args.model_cache else None


def run(args: argparse.Namespace) -> int:
    """Run one `model` action; errors are one line on stderr and exit code 2."""
    actions = {"pull": _pull, "list": _list, "path": _path}
    try:
        return actions[args.model_command](args)
    except (ValueError, LookupError, models.PullError, OSError) as exc:
        print(f"splitserve: error: {exc}", file=sys.stderr)
        return 2


def _pull(args: argparse.Namespace) -> int:
    # SIGTERM (kill, a pod shutdown) unwinds like Ctrl-C, so the pull removes its temp dir.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        print(models.pull(args.name, _cache(args), progress=not args.quiet))
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _list(args: argparse.Namespace) -> int:
    rows = [("NAME", "STATUS", "PATH", "DESCRIPTION")]
    cache = _cache(args)
    for name, spec in models.REGISTRY.items():
        status = "pulled" if models.is_pulled(name, cache) else "not pulled"
        rows.append((name, status, str(models.cache_path(name, cache)), spec.description))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[3]]))
    return 0


def _path(args: argparse.Namespace) -> int:
    print(models.resolve_model(args.name, _cache(args)))
    return 0
