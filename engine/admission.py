"""What a request must be to enter the engine: its token ids within the vocabulary and its
length within the context (a generating request leaves room for one token, a pooling pass
does not), and how far behind a decoding request's blocks go back to the pool."""

from __future__ import annotations

from engine.config import EngineConfig, Role
from engine.model.config import ModelConfig
from models.sampling_params import SamplingParams


def check_request(
    request_id: str,
    prompt_token_ids: list[int],
    params: SamplingParams,
    vocab: int,
    max_model_len: int,
) -> None:
    """ValueError naming what a generating request gets wrong."""
    if any(not 0 <= t < vocab for t in prompt_token_ids):
        raise ValueError(f"request {request_id}: prompt token ids must be in [0, {vocab})")
    if any(t >= vocab for t, _ in params.logit_bias):
        raise ValueError(f"request {request_id}: logit_bias token ids must be in [0, {vocab})")
    if len(prompt_token_ids) >= max_model_len:
        raise ValueError(
            f"request {request_id}: prompt has {len(prompt_token_ids)} tokens, the context "
            f"length is {max_model_len} (at least one token must be generated)"
        )


def check_input(request_id: str, token_ids: list[int], vocab: int, max_model_len: int) -> None:
    """ValueError naming what a pooling pass's input gets wrong."""
    if not token_ids or any(not 0 <= t < vocab for t in token_ids):
        raise ValueError(f"request {request_id}: the input needs token ids in [0, {vocab})")
    if len(token_ids) > max_model_len:
        raise ValueError(
            f"request {request_id}: the input has {len(token_ids)} tokens, the "
            f"context length is {max_model_len}"
        )


def release_window(config: EngineConfig, model: ModelConfig) -> int:
    """The window behind which a decoding request's blocks go back to the pool: the one
    every layer shares, except on a prefill node (its blocks are shipped whole) and with a
    draft model (its cache shares the block tables and may attend to everything)."""
    if config.role is Role.PREFILL or config.speculative_method == "draft":
        return 0
    return model.sliding_window
