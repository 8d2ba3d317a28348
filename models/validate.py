"""Validation of a model directory: a Hugging Face directory of a family the engine loads
(models.architectures): config.json, tokenizer.json and the weights: *.safetensors (sharded
with an index, or not), or one GGUF file, whose header and tensor table are checked here
(models.gguf_header). What a family's config asks of the engine (windows, scaling, experts)
the engine checks."""

from __future__ import annotations

import json
from pathlib import Path

from models.architectures import family_of
from models.gguf_header import read_gguf_header
from models.weights import SAFETENSORS_INDEX, gguf_file, gguf_files, has_safetensors


def validate_model_dir(path: Path | str, weights: bool = True) -> None:
    """Check that `path` is a HF directory of a family the engine can load (with its weights
    unless `weights` is False: an engine that makes random weights needs none).

    Raises ValueError with one line naming the path and the problem (every missing file).
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"model dir {path}: directory not found")
    if not path.is_dir():
        raise ValueError(f"model dir {path}: not a directory")
    missing = _missing(path, weights)
    if missing:
        raise ValueError(f"model dir {path}: {'; '.join(missing)}")
    _check_architecture(path, _read_config(path))
    if weights:
        _check_weights(path)


def _missing(path: Path, weights: bool) -> list[str]:
    """What the directory lacks, in words (its weights only when `weights`)."""
    files = ("config.json", "tokenizer.json")
    missing = [f"{name} not found" for name in files if not (path / name).is_file()]
    if weights and not has_safetensors(path) and not gguf_files(path):
        missing.append("no weights found (*.safetensors, or a *.gguf file)")
    return missing


def _read_config(path: Path) -> dict[str, object]:
    config_file = path / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"model dir {path}: config.json unreadable ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"model dir {path}: config.json is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"model dir {path}: config.json is not a JSON object")
    return config


def _check_architecture(path: Path, config: dict[str, object]) -> None:
    try:
        family_of(config)
    except ValueError as exc:
        raise ValueError(f"model dir {path}: {exc}") from None


def _check_weights(path: Path) -> None:
    """With an index, every shard it names; without safetensors, one GGUF; every GGUF's
    header and tensor table."""
    if (path / SAFETENSORS_INDEX).is_file():
        _check_index(path / SAFETENSORS_INDEX)
    elif not has_safetensors(path):
        gguf_file(path)  # several are refused: which one is meant?
    for gguf in gguf_files(path):
        read_gguf_header(gguf)


def _check_index(index: Path) -> None:
    path = index.parent
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as exc:
        raise ValueError(f"model dir {path}: {index.name} is unreadable ({exc})") from None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"model dir {path}: {index.name} has no weight_map")
    missing = sorted({str(f) for f in weight_map.values()} - _files(path))
    if missing:
        raise ValueError(
            f"model dir {path}: {index.name} names shard {missing[0]!r}, which is missing"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )


def _files(path: Path) -> set[str]:
    return {p.name for p in path.iterdir() if p.is_file()}
