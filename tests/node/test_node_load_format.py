"""--load-format, a node setting declared by the engine alone (engine.config): the node's flag
and variable reach the engine config, and a bad value is refused before any model loads."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from node.cli import settings_from_args
from node.core import build_engine_config
from tests.node.node_args import parse_decode_args


def test_the_flag_reaches_the_engine_config(tmp_path: Path) -> None:
    settings = settings_from_args(parse_decode_args("--load-format", "random"), "decode")
    assert build_engine_config(settings, tmp_path).load_format == "random"
    default = settings_from_args(parse_decode_args(), "decode")
    assert build_engine_config(default, tmp_path).load_format == "safetensors"


def test_the_variable_reaches_the_engine_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPLITSERVE_LOAD_FORMAT", "random")
    settings = settings_from_args(parse_decode_args(), "prefill")
    assert build_engine_config(settings, tmp_path).load_format == "random"
    flag = settings_from_args(parse_decode_args("--load-format", "safetensors"), "prefill")
    assert flag.engine.load_format == "safetensors"  # the flag wins


def test_a_bad_value_is_refused_by_the_parser() -> None:
    with pytest.raises(argparse.ArgumentError, match="--load-format: must be one of"):
        parse_decode_args("--load-format", "dummy")
