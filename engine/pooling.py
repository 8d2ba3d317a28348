"""Pooling: one vector per prompt from the final norm's hidden states (embeddings).

A pooling pass is prefill only: it takes blocks for the prompt, runs the forward over it in
chunks of at most ``max_num_batched_tokens`` (later chunks attend to the K/V the earlier ones
wrote), reduces the hidden states to one vector and gives every block back before it
returns, whatever happens. No token is sampled and nothing is cached.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

import torch

from engine.kv.block_manager import BlockManager
from engine.model.attention import AttentionMetadata
from engine.step.runner import ModelRunner

PoolingType = Literal["last", "mean"]
POOLING_TYPES: tuple[str, ...] = get_args(PoolingType)


@dataclass(frozen=True)
class PoolingParams:
    """How the hidden states become one vector: the last token's or the mean of all, and
    scaled to unit L2 norm or not (vLLM's pooler options)."""

    pooling: PoolingType = "last"
    normalize: bool = True

    def __post_init__(self) -> None:
        if self.pooling not in POOLING_TYPES:
            raise ValueError(f"pooling must be one of {POOLING_TYPES}, got {self.pooling!r}")


class NoRoom(RuntimeError):
    """Too few free KV blocks for the prompt now (the node answers 503: try elsewhere)."""


@dataclass
class _Scratch:
    """The pass's hold on blocks, as the block manager sees a request (BlockOwner)."""

    request_id: str
    num_tokens: int
    block_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_released_blocks: int = 0
    swapped_slots: list[int] = field(default_factory=list)
    hash_root: int | None = None
    num_known_tokens: int = 0
    all_token_ids: list[int] = field(default_factory=list)


@torch.inference_mode()
def pool_prompt(
    runner: ModelRunner,
    blocks: BlockManager,
    request_id: str,
    token_ids: list[int],
    params: PoolingParams,
    chunk_tokens: int,
) -> list[float]:
    """The prompt's pooled vector [hidden] as floats; its blocks are free again on return.
    Raises NoRoom when the prompt's blocks are not free now."""
    scratch = _Scratch(request_id, len(token_ids))
    if not blocks.allocate(scratch, len(token_ids)):
        raise NoRoom(
            f"{blocks.blocks_for(len(token_ids))} KV blocks needed, {blocks.num_free_blocks} free"
        )
    try:
        if runner.lora is not None:
            runner.lora.bind(None)
        return _pool(runner, scratch.block_ids, token_ids, params, chunk_tokens).tolist()
    finally:
        blocks.free(scratch)


def _pool(
    runner: ModelRunner,
    block_ids: list[int],
    token_ids: list[int],
    params: PoolingParams,
    chunk_tokens: int,
) -> torch.Tensor:
    device, block_size = runner.device, runner.config.block_size
    total: torch.Tensor | None = None  # [hidden] float32: the sum (mean) or the last row
    for start in range(0, len(token_ids), chunk_tokens):
        chunk = token_ids[start : start + chunk_tokens]
        meta = AttentionMetadata.build([len(chunk)], [start], [block_ids], block_size, device)
        ids = torch.tensor(chunk, dtype=torch.int64, device=device)  # [tokens]
        h = runner.model.hidden_states(ids, meta, runner.kv_cache).float()  # [tokens, hidden]
        if params.pooling == "last":
            total = h[-1]
        else:
            part = h.sum(0)
            total = part if total is None else total + part
    assert total is not None
    vector = total / len(token_ids) if params.pooling == "mean" else total
    if params.normalize:
        vector = torch.nn.functional.normalize(vector, dim=0)
    return vector.cpu()
