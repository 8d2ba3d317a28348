"""The `splitserve` command as a new user meets it: --version, a mistyped flag named by the
subcommand's own usage with the closest flag, one model cache flag everywhere (the old name a
deprecated alias), and `generate` without a prompt refused."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from cluster.version import version
from launcher import cli

MODEL_CACHE_COMMANDS = [
    ["model", "pull"], ["model", "list"], ["model", "path", "smollm2"], ["generate", "hi"],
    ["up"], ["router"], ["prefill"], ["decode"],
]  # fmt: skip


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="splitserve", exit_on_error=False)
    sub = parser.add_subparsers(dest="command")
    command = sub.add_parser(argv[0], prog=f"splitserve {argv[0]}")
    cli.COMMANDS[argv[0]][0]().add_arguments(command)
    return parser.parse_args(argv)


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out == f"splitserve {version()}" and version() != "unknown"


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
        (["up", "--key-limit", "*:rpm=5"], "usage: splitserve up ", "--key-limits"),
        (["up", "--tensor-paralel-size", "2"], "usage: splitserve up ", "--tensor-parallel-size"),
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
    assert _parse([*argv, "--model-cache", "/cache/a"]).model_cache == Path("/cache/a")
    assert "deprecated" not in capsys.readouterr().err
    assert _parse([*argv, "--cache-dir", "/cache/b"]).model_cache == Path("/cache/b")
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


# (command line with an abbreviated flag, the flag in full)
ABBREVIATED = [
    (["up", "--kv-offload-cpu", "1"], "--kv-offload-cpu-gb"),
    (["router", "--max-inflig", "8"], "--max-inflight"),
    (["prefill", "--lease-ttl", "5"], "--lease-ttl-s"),
    (["decode", "--max-num-se", "3"], "--max-num-seqs"),
    (["planner", "--ttft-slo", "500"], "--ttft-slo-ms"),
    (["generate", "hi", "--max-tok", "4"], "--max-tokens"),
    (["bench", "serve", "--num-req", "4"], "--num-requests"),
    (["model", "pull", "--qui"], "--quiet"),
]


@pytest.mark.parametrize(("argv", "full"), ABBREVIATED, ids=[" ".join(a) for a, _ in ABBREVIATED])
def test_an_abbreviated_flag_is_refused_naming_the_full_one(
    argv: list[str], full: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--kv-offload-cpu 1` once started a cluster as --kv-offload-cpu-gb: no prefix of a
    flag stands for it, on any subcommand."""
    parser = cli._build_parser(argv)
    _, extras = parser.parse_known_args(argv)
    abbreviated = next(a for a in argv if a.startswith("--"))
    assert abbreviated in extras
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)  # refused before anything runs
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"unrecognized arguments: {abbreviated}" in err and f"(did you mean {full}?)" in err


def test_a_far_flag_is_no_suggestion() -> None:
    """--key-limits once got `did you mean --ready-timeout-s?`, --max-num-batched-tokens
    `--num-speculative-tokens`: neither means anything close."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-timeout-s")
    parser.add_argument("--num-speculative-tokens")
    for typo in ("--key-limits", "--max-num-batched-tokens"):
        assert cli.unrecognized(parser, [typo, "1"]) == f"unrecognized arguments: {typo} 1"


def test_every_argument_parser_of_the_project_refuses_abbreviations() -> None:
    """A parser built outside the `splitserve` command (`python -m bench.offline`) too."""
    root = Path(__file__).resolve().parents[2]
    calls = []
    for path in sorted(root.glob("*/**/*.py")):
        if path.parts[len(root.parts)] in ("tests", "docs") or ".venv" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and _called(node) == "ArgumentParser":
                calls.append((path.relative_to(root), node))
    assert len(calls) > 10
    for where, call in calls:
        flags = {k.arg: k.value for k in call.keywords}
        value = flags.get("allow_abbrev")
        assert isinstance(value, ast.Constant) and value.value is False, f"{where}:{call.lineno}"


def _called(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
