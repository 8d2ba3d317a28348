"""Validation of a model directory: a Hugging Face directory of a family the engine loads
(models.architectures): config.json, *.safetensors (sharded with an index, or not), tokenizer.json.
What a family's config asks of the engine (windows, scaling, experts) the engine checks."""

from __future__ import annotations

import json
from pathlib import Path

from models.architectures import family_of


def validate_model_dir(path: Path | str, weights: bool = True) -> None:
    """Check that `path` is a HF directory of a family the engine can load (with its weights
    unless `weights` is False: an engine that makes random weights needs none).

    Raises ValueError with one line naming the path and the problem.
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"model dir {path}: directory not found")
    if not path.is_dir():
        raise ValueError(f"model dir {path}: not a directory")
    config = _read_config(path)
    _check_architecture(path, config)
    if weights:
        _check_weights(path)
    if not (path / "tokenizer.json").is_file():
        raise ValueError(f"model dir {path}: tokenizer.json not found")


def _read_config(path: Path) -> dict[str, object]:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"model dir {path}: config.json not found")
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
    """Weights: *.safetensors; with an index, every shard it names."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
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
    elif not any(path.glob("*.safetensors")):
        raise ValueError(f"model dir {path}: no *.safetensors weights found")


def _files(path: Path) -> set[str]:
    return {p.name for p in path.iterdir() if p.is_file()}
