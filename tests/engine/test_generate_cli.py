"""`splitserve generate`: the nodes' engine flags (quantization, KV cache dtype,
--enforce-eager, LoRA) by the
same names, help and choices, checked alike, and reaching the engine."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

import engine.llm
from engine import cli
from engine.flags import ENGINE_FLAGS, ENGINE_SWITCHES, LORA_SWITCHES, flag
from engine.llm import LLM
from engine.lora.request import LoRARequest
from models.sampling_params import SamplingParams
from node.cli import add_node_arguments
from tests.engine.tiny_llama import save_tiny_llama
from tests.engine.tiny_tokenizer import save_byte_tokenizer
from tests.lora_adapters import make_adapter
from tests.node.node_args import parse_decode_args

PROMPT = "a b c d e f"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    cli.add_arguments(parser)
    return parser


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.option_strings[0]: a for a in parser._actions if a.option_strings}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny Llama with a byte tokenizer, and a LoRA adapter of it."""
    root = tmp_path_factory.mktemp("generate")
    save_tiny_llama(root / "base", vocab_size=300)
    save_byte_tokenizer(root / "base")
    return root / "base", make_adapter(root / "base", root / "sql", seed=0)


def test_the_engine_flags_are_the_nodes() -> None:
    generate = _actions(_parser())
    parser = argparse.ArgumentParser()
    add_node_arguments(parser, ("decode",))
    node = _actions(parser)
    for name in (*ENGINE_FLAGS, *ENGINE_SWITCHES, *LORA_SWITCHES):
        mine, theirs = generate[flag(name)], node[flag(name)]
        assert (mine.help, mine.type, mine.nargs) == (theirs.help, theirs.type, theirs.nargs)
        assert list(mine.choices or ()) == list(theirs.choices or ()), name


@pytest.mark.parametrize(
    "argv",
    [["--quantization", "int3"], ["--kv-cache-dtype", "int4"], ["--max-loras", "two"]],
)
def test_bad_values_are_refused_by_both(argv: list[str]) -> None:
    with pytest.raises(argparse.ArgumentError):
        _parser().parse_args([*argv, PROMPT])
    with pytest.raises(argparse.ArgumentError):
        parse_decode_args(*argv)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lora-modules", "sql=/x"], "lora_modules needs enable_lora"),
        (["--enable-lora", "--lora-modules", "sql"], "lora_modules entry 'sql' is not name=path"),
        (["--enable-lora", "--lora-modules", "sql=/x", "--lora", "web"],
         "--lora 'web' is not one of --lora-modules (sql)"),
        (["--enable-lora", "--lora-modules", "sql=/x"],
         "--lora-modules is given but no --lora names the adapter to use"),
        (["--enable-lora", "--max-loras", "0"], "max_loras must be an integer >= 1, got 0"),
    ],
)  # fmt: skip
def test_bad_lora_settings_exit_2_naming_them(
    argv: list[str], message: str, tiny: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = _parser().parse_args([PROMPT, "--model", str(tiny[0]), *argv])
    assert cli.run(args) == 2
    err = capsys.readouterr().err
    assert message in err and "\n" not in err.strip()


def test_the_flags_reach_the_engine_and_the_adapter_the_prompt(
    tiny: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    base, adapter = tiny
    made: list[LLM] = []

    class Recorded(LLM):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            made.append(self)

    monkeypatch.setattr(engine.llm, "LLM", Recorded)
    argv = ["--model", str(base), "--raw", "--max-tokens", "8", "--quantization", "none",
            "--kv-cache-dtype", "int8", "--enable-lora", "--max-lora-rank", "8", "--enforce-eager",
            "--lora-modules", f"sql={adapter}", "--lora", "sql", PROMPT]  # fmt: skip
    assert cli.run(_parser().parse_args(argv)) == 0
    config = made[0].engine.config
    assert (config.quantization, config.kv_cache_dtype) == ("none", "int8")
    assert (config.enable_lora, config.max_lora_rank, config.enforce_eager) == (True, 8, True)
    params = SamplingParams(max_tokens=8, temperature=0.0)
    lora = LoRARequest("sql", 1, adapter)
    want = made[0].generate([PROMPT], params, lora_request=lora)[0].text
    base_text = made[0].generate([PROMPT], params)[0].text
    assert want != base_text  # the adapter changes the answer
    assert capsys.readouterr().out == f"> {PROMPT}\n{want}\n\n"
