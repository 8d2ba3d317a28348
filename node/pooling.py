"""POST /internal/embed on any node: a prompt's pooled vector from a prefill-only pass in
the engine thread that leaves no block taken and no lease (engine.pooling)."""

from __future__ import annotations

from collections import Counter

from cluster.protocol import EmbedRequest, EmbedResponse
from engine.loop.engine_loop import EngineLoop
from engine.pooling import NoRoom, PoolingParams
from node.errors import NodeError, bad_request, checked_async
from node.metrics import NodeMetrics


async def embed(
    loop: EngineLoop, metrics: NodeMetrics, counts: Counter[str], req: EmbedRequest
) -> EmbedResponse:
    """The vector; 400 naming the field for a bad input or `dimensions`, 503 while the
    prompt's blocks are taken."""
    hidden = loop.engine.model_config.hidden_size
    if req.dimensions is not None and req.dimensions != hidden:
        raise bad_request(
            f"dimensions {req.dimensions} is not supported: this model's embeddings have "
            f"{hidden} dimensions and are not truncatable",
            "dimensions",
        )
    params = PoolingParams(req.pooling, req.normalize)
    ids, rid = list(req.prompt_token_ids), req.request_id
    counts["embeddings_total"] += 1
    try:
        vector = await checked_async(
            loop.call(lambda engine: engine.embed(rid, ids, params)), "prompt_token_ids"
        )
    except NoRoom as exc:
        raise NodeError(503, "no_room", str(exc)) from None
    metrics.prompt_tokens.inc(len(ids))
    return EmbedResponse(request_id=rid, embedding=vector, num_prompt_tokens=len(ids))
