"""A node's KV cache as the cluster sees it: the whole model's layout (the same whatever the
tensor-parallel size, so pools of different sizes match) and, on a tensor-parallel node,
every rank's tensor with the KV heads it holds, for the transfer agent."""

from __future__ import annotations

from engine.engine import LLMEngine
from engine.kv.cache import KVLayout
from engine.model.shard import Shard
from kv_transfer.head_plan import HeadSpan
from kv_transfer.shards import KVShards


def model_layout(engine: LLMEngine) -> KVLayout:
    """The layout of the whole model's KV (every KV head), whatever rank holds which."""
    local = engine.runner.layout
    return KVLayout.for_model(engine.model_config, local.dtype, local.block_size, local.kv_dtype)


def layout_text(engine: LLMEngine) -> str:
    """The layout's readable line with the node's tensor-parallel size (named in errors)."""
    return f"{model_layout(engine).describe()} tp={engine.config.tensor_parallel_size}"


def kv_shards(engine: LLMEngine) -> KVShards | None:
    """Every rank's KV tensor and heads (rank 0's first); None on a node of one rank."""
    if engine.ranks is None:
        return None
    config, size = engine.model_config, engine.config.tensor_parallel_size
    spans = [
        HeadSpan(
            *Shard(rank, size).heads(config.num_attention_heads, config.num_key_value_heads)[1]
        )
        for rank in range(size)
    ]
    tensors = [engine.runner.kv_cache, *engine.ranks.kv_caches()]
    return KVShards(tensors, spans, config.num_key_value_heads)
