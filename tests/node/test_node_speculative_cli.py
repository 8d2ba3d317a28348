"""The speculative decoding flags of the node command and of `splitserve up`."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import pytest

from launcher import up as launcher
from launcher import up_plan
from node.cli import settings_from_args
from node.core import build_engine_config
from tests.node.node_args import parse_decode_args, refusal


def test_flags_reach_the_engine_config(tmp_path: Path) -> None:
    args = parse_decode_args(
        "--speculative-method", "ngram", "--num-speculative-tokens", "6", "--device", "cpu"
    )
    config = build_engine_config(settings_from_args(args, "decode"), tmp_path)
    assert (config.speculative_method, config.num_speculative_tokens) == ("ngram", 6)
    default = build_engine_config(settings_from_args(parse_decode_args(), "decode"), tmp_path)
    assert default.speculative_method == "none"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-speculative-tokens", "0"], "--num-speculative-tokens: must be >= 1"),
        (["--num-speculative-tokens", "17"], "--num-speculative-tokens: must be <= 16"),
        (["--speculative-method", "draft"], "draft_model"),
        (["--draft-model", "tiny"], "draft_model"),
    ],
)
def test_bad_values_exit_2_naming_them(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in refusal(argv, capsys)


def test_unknown_method_is_refused_by_the_parser() -> None:
    with pytest.raises(argparse.ArgumentError):
        parse_decode_args("--speculative-method", "medusa")


def _launcher_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    launcher.add_arguments(parser)
    return parser.parse_args(list(argv))


def _parse_child(argv: list[str]) -> argparse.Namespace:
    command, rest = argv[3], argv[4:]
    module = {"prefill": "prefill_node.cli", "decode": "decode_node.cli"}[command]
    parser = argparse.ArgumentParser(exit_on_error=False)
    importlib.import_module(module).add_arguments(parser)
    return parser.parse_args(rest)


def test_up_passes_the_flags_to_decode_nodes_only(tmp_path: Path) -> None:
    args = _launcher_args("--speculative-method", "ngram", "--num-speculative-tokens", "3")
    seen = {}
    for plan in up_plan.plan_nodes(args):
        argv = up_plan.node_argv(args, tmp_path, "redis://h:1/0", plan)
        assert argv[:3] == [sys.executable, "-m", "launcher.cli"]
        parsed = _parse_child(argv)
        seen[plan.role] = (parsed.speculative_method, parsed.num_speculative_tokens)
    assert seen == {"prefill": (None, None), "decode": ("ngram", 3)}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-speculative-tokens", "0"], "--num-speculative-tokens"),
        (["--speculative-method", "draft"], "needs draft_model"),
    ],
)
def test_up_refuses_bad_values(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        args = _launcher_args(*argv, "--port", "0")
    except argparse.ArgumentError as exc:
        assert message in str(exc)
        return
    assert launcher.run(args) == 2
    assert message in capsys.readouterr().err


def test_metrics_show_speculative_totals_and_the_acceptance_histogram() -> None:
    from node.metrics import NodeMetrics

    metrics = NodeMetrics("decode", "n1")
    counters = {"spec_proposed": 10, "spec_accepted": 4, "spec_emitted": 9, "spec_chunks": 5}
    counters |= {"spec_acceptance_sum": 2.0}
    counters |= {f"spec_acceptance_bucket_{i}": i + 1 for i in range(5)}
    metrics.watch(lambda: counters)
    text = metrics.render()[0].decode()
    labels = 'node="n1",role="decode"'
    assert f"splitserve_spec_proposed_tokens_total{{{labels}}} 10.0" in text
    assert f"splitserve_spec_accepted_tokens_total{{{labels}}} 4.0" in text
    assert f"splitserve_spec_emitted_tokens_total{{{labels}}} 9.0" in text
    assert f'splitserve_spec_acceptance_rate_bucket{{le="0.5",{labels}}} 3.0' in text
    assert f"splitserve_spec_acceptance_rate_count{{{labels}}} 5.0" in text
