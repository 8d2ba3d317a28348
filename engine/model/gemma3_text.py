"""The text model of a ``Gemma3ForConditionalGeneration`` checkpoint (Gemma 3 4B / 12B / 27B,
image and text in): its ``config.json`` nests the text model's fields under ``text_config``,
which names only those that differ from transformers' ``Gemma3TextConfig`` defaults. The
engine reads them without transformers: the defaults are written out here, from that
class, and applied to the fields the checkpoint leaves out. The vision tower and the
projector are not read (``engine.model.checkpoint_files.text_model_name``): the engine
serves the text model, prompts of token ids only."""

from __future__ import annotations

from typing import Any

from engine.model.config_fields import Fields

ARCHITECTURE = "Gemma3ForConditionalGeneration"
# transformers' Gemma3TextConfig defaults (the 4B model's shape where it sets one)
TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "eos_token_id": 1,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
}
# without rope_parameters: the global and the local layers' bases
ROPE_DEFAULTS: dict[str, Any] = {"rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0}


def text_fields(fields: Fields) -> Fields:
    """The text model's fields of a ``Gemma3ForConditionalGeneration`` config, defaulted;
    errors name ``text_config`` in the file."""
    text = fields.raw.get("text_config")
    if not isinstance(text, dict):
        raise fields.error(f"{ARCHITECTURE} needs a 'text_config' object, got {text!r}")
    given = {k: v for k, v in text.items() if v is not None}
    raw = TEXT_DEFAULTS | ({} if "rope_parameters" in given else ROPE_DEFAULTS) | given
    # the outer model ties its head (transformers' default when the config does not say)
    raw["tie_word_embeddings"] = bool(fields.raw.get("tie_word_embeddings", True))
    raw["architectures"] = [ARCHITECTURE]
    return Fields(raw, f"{fields.source} (text_config)")
