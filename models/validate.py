"""Validation of a model directory: a Hugging Face Llama-family directory the engine loads."""

from __future__ import annotations

import json
from pathlib import Path

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
_ARCH_BY_MODEL_TYPE = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}


def validate_model_dir(path: Path | str) -> None:
    """Check that `path` is a HF Llama-family directory the engine can load.

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
    archs = config.get("architectures")
    if not archs:  # older exports leave it empty; fall back on model_type
        fallback = _ARCH_BY_MODEL_TYPE.get(str(config.get("model_type")))
        archs = [fallback] if fallback else None
    if not isinstance(archs, list) or not archs:
        raise ValueError(f"model dir {path}: config.json names no architecture")
    arch = archs[0]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"model dir {path}: architecture {arch!r} is not supported "
            f"(Llama family only: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    window = config.get("sliding_window")
    if arch == "MistralForCausalLM" and window is not None:
        raise ValueError(
            f"model dir {path}: {arch} with sliding_window={window} is not supported "
            "(no sliding-window attention)"
        )
