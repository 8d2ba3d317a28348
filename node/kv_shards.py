"""A node's KV cache as the cluster sees it: the whole model's layout (the same whatever the
tensor- and pipeline-parallel sizes, so pools of different sizes match) and, on a node of
several ranks, every rank's tensor with the layers (its pipeline stage's) and KV heads (its
tensor-parallel share) it holds, for the transfer agent; each rank then serves its own shard
from its own process (its own TCP listener, or its own NIXL agent)."""

from __future__ import annotations

from engine.engine import LLMEngine
from engine.kv.cache import KVLayout
from engine.model.shard import Shard
from engine.model.stage import Stage
from kv_transfer.agent import KVTransferAgent
from kv_transfer.head_plan import HeadSpan, LayerSpan
from kv_transfer.rank_agent import serve_rank_nixl
from kv_transfer.rank_server import serve_rank_kv
from kv_transfer.shards import KVShards


def model_layout(engine: LLMEngine) -> KVLayout:
    """The layout of the whole model's KV (every layer and KV head), whatever rank holds
    which."""
    local = engine.runner.layout
    return KVLayout.for_model(engine.model_config, local.dtype, local.block_size, local.kv_dtype)


def layout_text(engine: LLMEngine) -> str:
    """The layout's readable line with the node's parallel sizes (named in errors)."""
    tp, pp = engine.config.tensor_parallel_size, engine.config.pipeline_parallel_size
    return f"{model_layout(engine).describe()} tp={tp} pp={pp}"


def kv_shards(engine: LLMEngine) -> KVShards | None:
    """Every rank's KV tensor, layers (those of the cache: a hybrid model's attention
    layers) and heads (rank 0's first); None on a node of one rank. Global rank ``r`` is
    tensor-parallel rank ``r % TP`` of stage ``r // TP``."""
    if engine.ranks is None:
        return None
    config = engine.model_config
    tp, pp = engine.config.tensor_parallel_size, engine.config.pipeline_parallel_size
    heads, layers = [], []
    for rank in range(tp * pp):
        shard = Shard(rank % tp, tp)
        heads.append(
            HeadSpan(*shard.heads(config.num_attention_heads, config.num_key_value_heads)[1])
        )
        layers.append(LayerSpan(*Stage.of(len(config.kv_layers), rank // tp, pp).layers))
    tensors = [engine.runner.kv_cache, *engine.ranks.kv_caches()]
    return KVShards(tensors, heads, config.num_key_value_heads, layers)


def serve_rank_shards(engine: LLMEngine, agent: KVTransferAgent) -> None:
    """Serve each rank's KV shard from its own process, advertised in the agent's PeerInfo:
    over TCP on the rank's own listener, over NIXL with the rank's own agent (nothing on a
    node of one rank)."""
    if engine.ranks is None:
        return
    listeners = agent.rank_listeners()
    if listeners:
        agent.use_rank_listeners(engine.ranks.call_on_ranks(serve_rank_kv, listeners))
    setups = agent.rank_agents()
    if setups:
        agent.use_rank_agents(engine.ranks.call_on_ranks(serve_rank_nixl, setups))
