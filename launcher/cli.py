"""The `splitserve` command. Each subcommand's module is imported explicitly, in a function of
its own, and only for the subcommand that runs: `splitserve router` never imports torch."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from cluster.version import version


class Command(Protocol):
    """A subcommand's module."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def _model() -> Command:
    from models import cli

    return cli


def _generate() -> Command:
    from engine import cli

    return cli


def _up() -> Command:
    from launcher import up

    return up


def _router() -> Command:
    from router import cli

    return cli


def _prefill() -> Command:
    from prefill_node import cli

    return cli


def _decode() -> Command:
    from decode_node import cli

    return cli


def _planner() -> Command:
    from planner import cli

    return cli


def _bench() -> Command:
    from bench import cli

    return cli


# subcommand -> (its module, help)
COMMANDS: dict[str, tuple[Callable[[], Command], str]] = {
    "model": (_model, "pull and list models"),
    "generate": (_generate, "offline generation with the engine (no cluster)"),
    "up": (_up, "start a local cluster: Redis, router, prefill and decode nodes"),
    "router": (_router, "run the OpenAI-compatible router"),
    "prefill": (_prefill, "run a prefill node"),
    "decode": (_decode, "run a decode node"),
    "planner": (_planner, "size the prefill and decode pools from TTFT / ITL targets"),
    "bench": (_bench, "benchmarks"),
}


class Parser(argparse.ArgumentParser):
    """A parser that takes no abbreviated flags (`--kv-offload-cpu` is not
    `--kv-offload-cpu-gb`); its subcommands' parsers are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def _build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = Parser(prog="splitserve", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (load, help_text) in COMMANDS.items():
        sp = sub.add_parser(name, help=help_text)
        if name == wanted:  # import only the module that runs
            module = load()
            module.add_arguments(sp)
            sp.set_defaults(_run=module.run)
    return parser


def _innermost(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.ArgumentParser:
    """The (sub)command parser that parsed the arguments: its usage is the one to show."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(args, action.dest, None)
            if chosen in action.choices:
                return _innermost(action.choices[chosen], args)
    return parser


# how close a mistyped flag must be to one the parser has for a suggestion (difflib's ratio):
# `--pefill` is 0.94 from `--prefill`; `--key-limits` is 0.62 from `--ready-timeout-s`
SUGGEST_CUTOFF = 0.75


def unrecognized(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """The error for arguments `parser` does not know, with the closest flag it has (a hidden
    deprecated alias is close to the flag that replaced it)."""
    shown = {
        a.dest: a.option_strings[-1]
        for a in parser._actions
        if a.option_strings and a.help != argparse.SUPPRESS
    }
    flags = {
        s: s if a.help != argparse.SUPPRESS else shown.get(a.dest, s)
        for a in parser._actions
        for s in a.option_strings
    }
    message = f"unrecognized arguments: {' '.join(extras)}"
    for extra in extras:
        if extra.startswith("-"):
            typed = extra.split("=", 1)[0]
            close = difflib.get_close_matches(typed, flags, n=1, cutoff=SUGGEST_CUTOFF)
            if close:
                return f"{message} (did you mean {flags[close[0]]}?)"
    return message


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser(args_list)
    args, extras = parser.parse_known_args(args_list)
    if extras:  # named by the subcommand that got them, with its usage
        command = _innermost(parser, args)
        command.error(unrecognized(command, extras))
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
