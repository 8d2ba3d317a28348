"""Model shape and hyper-parameters, parsed from a Hugging Face ``config.json``.

Only architectures whose math is exactly Llama's are accepted: no biases, SiLU MLP, RoPE
(plain or llama3-scaled), full attention. Anything else is refused with one clear line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}
_ROPE_TYPES = ("default", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """llama3 frequency scaling (Llama 3.1+). Plain RoPE has no RopeScaling at all."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    """What the engine needs to know about a Llama-family checkpoint."""

    name: str  # the model directory's name; part of the KV layout fingerprint
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_ids: frozenset[int]

    def __post_init__(self) -> None:
        for field in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "vocab_size",
            "max_position_embeddings",
        ):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelConfig.{field} must be an integer >= 1, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        """Parse ``config.json`` (and ``generation_config.json`` when present) of a HF dir."""
        model_dir = Path(model_dir)
        path = model_dir / "config.json"
        if not path.is_file():
            raise ValueError(f"{path}: no config.json in the model directory")
        raw = _read_json(path)
        gen_path = model_dir / "generation_config.json"
        generation = _read_json(gen_path) if gen_path.is_file() else {}
        return cls.from_dict(raw, source=str(path), name=model_dir.name, generation=generation)

    @classmethod
    def from_dict(
        cls,
        raw: dict[str, Any],
        source: str = "config.json",
        name: str = "model",
        generation: dict[str, Any] | None = None,
    ) -> ModelConfig:
        """Parse a config dict; ``source`` names the file in error messages."""
        fields = _Fields(raw, source)
        _check_llama_math(fields)
        eos = _eos_ids(raw.get("eos_token_id"), source)
        if generation:
            eos |= _eos_ids(generation.get("eos_token_id"), f"{source} (generation_config)")
        values = _values(fields)
        try:
            return cls(name=name, eos_token_ids=frozenset(eos), **values)
        except ValueError as exc:
            raise fields.error(str(exc)) from None


class _Fields:
    """Typed access to a config dict; a missing or mistyped field names the file."""

    def __init__(self, raw: dict[str, Any], source: str) -> None:
        self.raw = raw
        self.source = source

    def integer(self, key: str, raw: dict[str, Any] | None = None) -> int:
        value = self._value(key, raw)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(f"{key!r} must be an integer, got {value!r}")
        return value

    def number(self, key: str, raw: dict[str, Any] | None = None) -> float:
        value = self._value(key, raw)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(f"{key!r} must be a number, got {value!r}")
        return float(value)

    def error(self, message: str) -> ValueError:
        return ValueError(f"{self.source}: {message}")

    def _value(self, key: str, raw: dict[str, Any] | None) -> Any:
        value = (self.raw if raw is None else raw).get(key)
        if value is None:
            raise self.error(f"required field {key!r} is missing")
        return value


def _values(fields: _Fields) -> dict[str, Any]:
    """The shape and hyper-parameter fields of ModelConfig, typed and defaulted."""
    raw = fields.raw
    num_heads = fields.integer("num_attention_heads")
    hidden = fields.integer("hidden_size")
    theta, scaling = _parse_rope(fields)
    return {
        "architecture": _architecture(fields),
        "hidden_size": hidden,
        "intermediate_size": fields.integer("intermediate_size"),
        "num_hidden_layers": fields.integer("num_hidden_layers"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": (
            fields.integer("num_key_value_heads") if _has(raw, "num_key_value_heads") else num_heads
        ),
        "head_dim": fields.integer("head_dim") if _has(raw, "head_dim") else hidden // num_heads,
        "vocab_size": fields.integer("vocab_size"),
        "rms_norm_eps": fields.number("rms_norm_eps"),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "max_position_embeddings": fields.integer("max_position_embeddings"),
        "tie_word_embeddings": bool(raw.get("tie_word_embeddings", False)),
    }


def _has(raw: dict[str, Any], key: str) -> bool:
    return raw.get(key) is not None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def _architecture(fields: _Fields) -> str:
    archs = fields.raw.get("architectures")
    if archs:
        if len(archs) != 1 or archs[0] not in SUPPORTED_ARCHITECTURES:
            raise fields.error(
                f"architectures={archs!r} is not supported (supported: "
                f"{', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        return str(archs[0])
    model_type = fields.raw.get("model_type")
    if model_type not in _MODEL_TYPES:
        raise fields.error(
            f"model_type={model_type!r} is not supported (no 'architectures' given; "
            f"supported model types: {', '.join(_MODEL_TYPES)})"
        )
    return _MODEL_TYPES[model_type]


def _check_llama_math(fields: _Fields) -> None:
    raw = fields.raw
    for flag in ("attention_bias", "mlp_bias"):
        if raw.get(flag):
            raise fields.error(f"{flag}={raw[flag]!r} is not supported (no biases)")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise fields.error(f"hidden_act={act!r} is not supported (silu only)")
    if raw.get("sliding_window") is not None:
        raise fields.error(
            f"sliding_window={raw['sliding_window']!r} is not supported (full attention only)"
        )


def _parse_rope(fields: _Fields) -> tuple[float, RopeScaling | None]:
    """(theta, scaling) from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling`."""
    params = fields.raw.get("rope_parameters")
    if params:
        theta = fields.number("rope_theta", params)
        scaling: dict[str, Any] | None = params
    else:
        theta = fields.number("rope_theta") if _has(fields.raw, "rope_theta") else 10000.0
        scaling = fields.raw.get("rope_scaling")
    if not scaling:
        return theta, None
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in _ROPE_TYPES:
        raise fields.error(
            f"rope_type={rope_type!r} is not supported (supported: {', '.join(_ROPE_TYPES)})"
        )
    if rope_type == "default":
        return theta, None
    return theta, RopeScaling(
        factor=fields.number("factor", scaling),
        low_freq_factor=fields.number("low_freq_factor", scaling),
        high_freq_factor=fields.number("high_freq_factor", scaling),
        original_max_position_embeddings=fields.integer(
            "original_max_position_embeddings", scaling
        ),
    )


def _eos_ids(value: Any, source: str) -> set[int]:
    if value is None:
        return set()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{source}: eos_token_id must be an integer or a list, got {value!r}")
    return set(values)
