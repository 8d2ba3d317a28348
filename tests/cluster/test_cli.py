"""The `splitserve` command as a new user meets it: --version, a mistyped flag named by the
subcommand's own usage with the closest flag, one model cache flag everywhere (the old name a
deprecated alias), and `generate` without a prompt refused."""

from __future__ import annotations

import argparse
import importlib

import pytest

from cluster import cli

MODEL_CACHE_COMMANDS = [
    ["model", "pull"], ["model", "list"], ["model", "path", "smollm2"], ["generate", "hi"],
    ["up"], ["router"], ["prefill"], ["decode"],
]  # fmt: skip


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="splitserve", exit_on_error=False)
    sub = parser.add_subparsers(dest="command")
    command = sub.add_parser(argv[0], prog=f"splitserve {argv[0]}")
    importlib.import_module(cli._COMMANDS[argv[0]][0]).add_arguments(command)
    return parser.parse_args(argv)


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out == f"splitserve {cli.version()}" and cli.version() != "unknown"


@pytest.mark.parametrize(
    ("argv", "usage", "suggestion"),
    [
        (["up", "--pefill", "2"], "usage: splitserve up ", "--prefill"),
        (["router", "--polcy", "kv_aware"], "usage: splitserve router ", "--policy"),
        (
            ["decode", "--max-num-sqs=3"],
            "usage: splitserve decode ",
            "--max-num-seqs",
        ),
        (["model", "list", "--cach-dir", "/x"], "usage: splitserve model list ", "--model-cache"),
        (["--verison"], "usage: splitserve ", "--version"),
    ],
)
def test_a_mistyped_flag_shows_the_subcommand_usage_and_the_closest_flag(
    argv: list[str], usage: str, suggestion: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    typo = next(a for a in argv if a.startswith("-"))
    assert f"error: unrecognized arguments: {typo}" in err
    assert err.rstrip().endswith(f"(did you mean {suggestion}?)"), err


def test_an_unknown_flag_with_nothing_close_gets_no_suggestion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli.main(["up", "--zzzzzz"])
    err = capsys.readouterr().err
    assert err.startswith("usage: splitserve up ") and "did you mean" not in err


@pytest.mark.parametrize("argv", MODEL_CACHE_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_every_subcommand_takes_model_cache_and_the_old_name_with_a_warning(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert _parse([*argv, "--model-cache", "/cache/a"]).model_cache == "/cache/a"
    assert "deprecated" not in capsys.readouterr().err
    assert _parse([*argv, "--cache-dir", "/cache/b"]).model_cache == "/cache/b"
    assert "--cache-dir is deprecated; use --model-cache" in capsys.readouterr().err


@pytest.mark.parametrize("argv", MODEL_CACHE_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_help_names_only_model_cache(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main([*argv[:2], "--help"] if argv[0] == "model" else [argv[0], "--help"])
    out = capsys.readouterr().out
    assert "--model-cache" in out and "--cache-dir" not in out


def test_generate_without_a_prompt_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["generate", "--max-tokens", "4"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: splitserve generate ")
    assert "the following arguments are required: PROMPT" in err
