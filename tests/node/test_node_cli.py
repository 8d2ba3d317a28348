"""The node command line: flags are the declared settings (the node's, the engine's, the
transfer agent's), bad values, busy ports and broken model directories fail before any model
loads."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest

from launcher.redis_server import free_port
from node.cli import add_node_arguments, run_node, settings_from_args
from node.core import build_engine_config, transfer_config
from node.settings import NodeSettings
from tests.models.gguf_files import write_gguf
from tests.node.node_args import refusal


def _parse(*argv: str, roles: tuple[str, ...] = ("decode", "colocated")) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_node_arguments(parser, roles)
    return parser.parse_args(list(argv))


def _never(settings: NodeSettings) -> object:
    raise AssertionError("the app must not be built")


def test_flags_become_settings() -> None:
    args = _parse(
        "--port", "9100", "--num-kv-blocks", "12", "--lease-ttl-s", "2.5",
        "--transfer", "tcp", "--role", "colocated", "--model-cache", "/m",
    )  # fmt: skip
    settings = settings_from_args(args, "decode")
    assert (settings.port, settings.engine.num_kv_blocks, settings.lease_ttl_s) == (9100, 12, 2.5)
    assert (settings.role, str(settings.model_cache)) == ("colocated", "/m")
    assert settings.transfer.transport == "tcp"
    assert transfer_config(settings).transport == "tcp"


def test_gpu_memory_utilization_reaches_the_engine_config(tmp_path: Path) -> None:
    args = _parse("--gpu-memory-utilization", "0.45", "--device", "cpu")
    config = build_engine_config(settings_from_args(args, "decode"), tmp_path)
    assert config.gpu_memory_utilization == 0.45
    assert (config.num_kv_blocks, config.kv_cache_memory_gb) == (None, None)  # sized by memory
    assert config.max_num_seqs == 64  # the CPU default; engine_config gives 256 on CUDA


def test_quantization_reaches_the_engine_config(tmp_path: Path) -> None:
    settings = settings_from_args(_parse("--quantization", "none"), "decode")
    assert build_engine_config(settings, tmp_path).quantization == "none"
    default = settings_from_args(_parse(), "decode")
    assert build_engine_config(default, tmp_path).quantization == "auto"
    with pytest.raises(argparse.ArgumentError):
        _parse("--quantization", "int3")


def test_enforce_eager_reaches_the_engine_config(tmp_path: Path) -> None:
    settings = settings_from_args(_parse("--enforce-eager"), "decode")
    assert build_engine_config(settings, tmp_path).enforce_eager is True
    default = settings_from_args(_parse(), "prefill")
    assert build_engine_config(default, tmp_path).enforce_eager is False


def test_float32_matmul_precision_reaches_the_engine_config(tmp_path: Path) -> None:
    settings = settings_from_args(_parse("--float32-matmul-precision", "medium"), "prefill")
    config = build_engine_config(settings, tmp_path)
    assert (config.float32_matmul_precision, config.role) == ("medium", "prefill")
    default = settings_from_args(_parse(), "decode")
    assert build_engine_config(default, tmp_path).float32_matmul_precision == "highest"
    with pytest.raises(argparse.ArgumentError):
        _parse("--float32-matmul-precision", "high")


@pytest.mark.parametrize("bad", ["0", "1.2"])
def test_gpu_memory_utilization_outside_zero_one_exits_2(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "--gpu-memory-utilization: must be" in refusal(["--gpu-memory-utilization", bad], capsys)


def test_choices_come_from_the_settings() -> None:
    with pytest.raises(argparse.ArgumentError):
        _parse("--transfer", "carrier-pigeon")
    with pytest.raises(argparse.ArgumentError):
        _parse("--role", "prefill")  # the decode command serves decode and colocated
    parser = argparse.ArgumentParser()
    add_node_arguments(parser, ("prefill",))
    assert "--role" not in parser.format_help()


def test_bad_settings_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse("--heartbeat-s", "5", "--ttl-s", "1")
    assert run_node(args, "decode", _never) == 2
    assert "ttl_s" in capsys.readouterr().err


def test_a_busy_port_exits_1_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        args = _parse("--port", str(busy.getsockname()[1]))
        assert run_node(args, "decode", _never) == 1
    assert "cannot listen" in capsys.readouterr().err


def test_a_corrupt_gguf_exits_2_in_one_line_before_the_app_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (model / "tokenizer.json").write_text("{}")
    gguf = write_gguf(model / "m.gguf")
    gguf.write_bytes(gguf.read_bytes()[:-100])  # a download cut short
    args = _parse("--model", str(model), "--port", str(free_port()))
    assert run_node(args, "decode", _never) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"{gguf}: not a valid GGUF file: tensor ")


def test_a_missing_model_exits_2_naming_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    args = _parse("--model", str(tmp_path), "--port", str(free_port()))
    assert run_node(args, "decode", _never) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(
        "tokenizer.json not found; no weights found (*.safetensors, or a *.gguf file)"
    )
