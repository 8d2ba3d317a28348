"""The `splitserve` command. Subcommands live in their own packages and are imported lazily,
so `splitserve router` never imports torch."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# subcommand -> (module, help). Each module defines add_arguments(parser) and run(args) -> int.
_COMMANDS: dict[str, tuple[str, str]] = {
    "model": ("models.cli", "pull and list models"),
    "generate": ("engine.cli", "offline generation with the engine (no cluster)"),
    "up": ("cluster.launcher", "start a local cluster: Redis, router, prefill and decode nodes"),
    "router": ("router.cli", "run the OpenAI-compatible router"),
    "prefill": ("prefill_node.cli", "run a prefill node"),
    "decode": ("decode_node.cli", "run a decode node"),
    "bench": ("bench.cli", "benchmarks"),
}


def _build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="splitserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_text) in _COMMANDS.items():
        sp = sub.add_parser(name, help=help_text)
        if name == wanted:  # import only the module that runs
            module = importlib.import_module(module_name)
            module.add_arguments(sp)
            sp.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser(args_list)
    args = parser.parse_args(args_list)
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
