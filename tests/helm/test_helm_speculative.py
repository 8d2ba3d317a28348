"""decode.speculative renders the node's speculative decoding flags (decode pool only)."""

from __future__ import annotations

import argparse
import importlib

import helm_python
import pytest
from helm_render import deployments, main_container, render


def _decode_args(values: dict[str, object]) -> argparse.Namespace:
    container = main_container(deployments(render(values))["decode"])
    command, *argv = (str(a) for a in container["args"])
    parser = argparse.ArgumentParser(exit_on_error=False)
    importlib.import_module(f"{command}_node.cli").add_arguments(parser)
    return parser.parse_args(argv)


def test_off_by_default() -> None:
    args = _decode_args({})
    assert (args.speculative_method, args.num_speculative_tokens) == (None, None)


def test_ngram_reaches_the_decode_pool_only() -> None:
    values = {"decode": {"speculative": {"method": "ngram", "numTokens": 6}}}
    args = _decode_args(values)
    assert (args.speculative_method, args.num_speculative_tokens) == ("ngram", 6)
    prefill = main_container(deployments(render(values))["prefill"])
    assert "--speculative-method" not in [str(a) for a in prefill["args"]]


def test_draft_passes_its_model() -> None:
    args = _decode_args({"decode": {"speculative": {"method": "draft", "draftModel": "tiny"}}})
    assert (args.speculative_method, str(args.draft_model)) == ("draft", "tiny")


@pytest.mark.parametrize(
    "speculative",
    [{"method": "medusa"}, {"numTokens": 0}, {"method": "draft"}, {"method": "ngram", "k": 2}],
)
def test_bad_values_fail_the_schema(speculative: dict[str, object]) -> None:
    with pytest.raises(helm_python.HelmValuesError, match="speculative"):
        render({"decode": {"speculative": speculative}})
