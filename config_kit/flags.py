"""Command-line flags generated from declarations: `--name-with-dashes` for each setting, its
aliases and deprecated names; every flag defaults to None (not given), so the environment and
the declared default apply underneath."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from config_kit.declare import Declared, declared
from config_kit.values import SettingError, check, from_text


def add_flags(
    parser: argparse.ArgumentParser | Any,
    settings: Iterable[Declared] | type,
    *,
    command_choices: Sequence[str] = (),
    prefix: str = "",
    dest_prefix: str = "",
    help_of: Callable[[Declared], str] | None = None,
) -> None:
    """A flag for each setting (of a class, or given ones). A `command` setting (a node's
    role) gets one only when `command_choices` offers several, limited to them. `prefix`
    names a variant (`--prefill-` + name), stored at `dest_prefix` + name."""
    items = declared(settings) if isinstance(settings, type) else tuple(settings)
    for d in items:
        choices = list(command_choices) if d.setting.command else list(d.choices) or None
        if d.setting.command and len(command_choices) < 2:
            continue
        names = [d.name, *d.setting.aliases]
        flags = ["--" + prefix + n.replace("_", "-") for n in names]
        text = help_of(d) if help_of else d.setting.help
        options = _options(d, choices)
        parser.add_argument(*flags, dest=dest_prefix + d.name, default=None, help=text, **options)
        for old in d.setting.deprecated:
            flag = "--" + prefix + old.replace("_", "-")
            parser.add_argument(
                flag, dest=dest_prefix + d.name, default=None, help=argparse.SUPPRESS,
                action=_deprecated(flags[0]), **_value_options(options),
            )  # fmt: skip


def _options(d: Declared, choices: list[str] | None) -> dict[str, Any]:
    if d.kind is bool:
        return {"action": argparse.BooleanOptionalAction}
    options: dict[str, Any] = {"type": _reader(d), "metavar": d.setting.metavar}
    if d.kind is list:
        options.update(nargs="+", action="extend", type=str)
    if choices:
        options.update(choices=choices, metavar=None)
    return options


def _value_options(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k in ("type", "nargs", "metavar", "choices")}


def _reader(d: Declared) -> Callable[[str], Any]:
    """argparse's type: the declared one, in its declared bounds (argparse names the flag
    on an error)."""

    def read(text: str) -> Any:
        try:
            value = from_text(d, text)
            check(d, value)
            return value
        except SettingError as exc:
            raise argparse.ArgumentTypeError(exc.problem) from None

    read.__name__ = d.kind.__name__
    return read


def _deprecated(replacement: str) -> type[argparse.Action]:
    """An action that stores the value as `replacement` does, with a warning on stderr."""

    class Deprecated(argparse.Action):
        def __call__(
            self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
            values: Any, option_string: str | None = None,
        ) -> None:  # fmt: skip
            print(
                f"{parser.prog}: warning: {option_string} is deprecated; use {replacement}",
                file=sys.stderr,
            )
            setattr(namespace, self.dest, values)

    return Deprecated


def given_flags(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """Public name -> value of each of `cls`'s settings the command line gave."""
    return {
        d.name: value for d in declared(cls) if (value := getattr(args, d.name, None)) is not None
    }
