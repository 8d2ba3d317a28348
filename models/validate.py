"""Validation of a model directory: a Hugging Face directory of a family the engine loads."""

from __future__ import annotations

import json
from pathlib import Path

from models.architectures import SUPPORTED_ARCHITECTURES, declared_architecture


def validate_model_dir(path: Path | str) -> None:
    """Check that `path` is a HF directory of an architecture the engine can load (the
    engine checks the rest of the config when it loads).

    Raises ValueError with one line naming the path and the problem.
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"model dir {path}: directory not found")
    if not path.is_dir():
        raise ValueError(f"model dir {path}: not a directory")
    config = _read_config(path)
    _check_architecture(path, config)
    if not any(path.glob("*.safetensors")):
        raise ValueError(f"model dir {path}: no *.safetensors weights found")
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
    arch, said = declared_architecture(config)
    if arch is None and not config.get("architectures") and not config.get("model_type"):
        raise ValueError(f"model dir {path}: config.json names no architecture")
    if arch is None:
        raise ValueError(
            f"model dir {path}: {said} is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
