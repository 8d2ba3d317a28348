"""The embeddings flow: each input's pooled vector from the prefill pool (without one, from
the decode or colocated nodes), picked by the routing policy, trying other nodes when one
fails. A pooling pass keeps no KV: there is no lease and no decode leg."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from cluster.node_records import NodeRecord
from cluster.protocol import PROTOCOL_VERSION, EmbedRequest, EmbedResponse
from router.errors import overloaded, unavailable
from router.flow.failures import node_failed, refused
from router.flow.request import Deadline
from router.node_client import NodeCallError
from router.routing.policy import Pools, saturated
from router.routing.prefix_index import PrefixQuery
from router.state import RouterState

MAX_CALLS = 16  # one request's node calls in flight at once


async def embed_all(
    state: RouterState, requests: Sequence[EmbedRequest], deadline: Deadline
) -> list[EmbedResponse]:
    """The answers to `requests`, in order; APIError when one fails (the others are
    cancelled): 503 without a prefill pool, 429 when it is full, 400 for a refused input."""
    pools = Pools.of(state.membership.nodes())
    retry_after = state.settings.retry_after_s
    pool = "prefill" if pools.prefill else "decode"
    candidates = pools.prefill or pools.local
    if not candidates:
        raise unavailable("no node is available", retry_after)
    if saturated(candidates, state.settings.max_queue):
        raise overloaded(f"every {pool} node is at its queue limit", retry_after)
    gate = asyncio.Semaphore(MAX_CALLS)

    async def one(req: EmbedRequest) -> EmbedResponse:
        async with gate:
            return await _embed_one(state, pool, candidates, req, deadline)

    tasks = [asyncio.create_task(one(r)) for r in requests]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        raise


def embed_request(
    request_id: str, ids: list[int], pooling: str, normalize: bool, dimensions: int | None
) -> EmbedRequest:
    """The node call of one input."""
    return EmbedRequest(
        request_id=request_id,
        prompt_token_ids=ids,
        pooling=pooling,  # type: ignore[arg-type]
        normalize=normalize,
        dimensions=dimensions,
        protocol_version=PROTOCOL_VERSION,
    )


async def _embed_one(
    state: RouterState,
    pool: str,
    candidates: Sequence[NodeRecord],
    req: EmbedRequest,
    deadline: Deadline,
) -> EmbedResponse:
    query = PrefixQuery(req.prompt_token_ids, None)
    tried: set[str] = set()
    busy = 0
    while len(tried) < state.settings.prefill_attempts:
        node = state.picker.pick(pool, candidates, tried, query)
        if node is None:
            break
        node_id = node.info.node_id
        tried.add(node_id)
        state.picker.begin(node_id)
        try:
            return await state.require_nodes().embed(node.info, req, deadline.at)
        except NodeCallError as err:
            if err.kind == "deadline":
                raise deadline.error() from None
            node_failed(state, req.request_id, pool, err)
            if err.kind == "refused":
                raise refused(err) from None
            busy += err.kind == "busy"
        finally:
            state.picker.end(node_id)
    retry_after = state.settings.retry_after_s
    if tried and busy == len(tried):
        raise overloaded(f"every {pool} node is busy", retry_after)
    raise unavailable(f"no {pool} node could compute the embedding", retry_after)
