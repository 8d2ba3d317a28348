"""POST /v1/embeddings' path: the key's limits, admission, the inputs in token ids, the
pooling passes on the prefill pool (router.flow.pooling), usage charged to the key."""

from __future__ import annotations

import asyncio
import time
import uuid

from fastapi import Request

from models.tokenizer import Tokenizer
from router.api.embeddings.request import EmbeddingList, EmbeddingRequest, embedding_list
from router.api.prompt import check_ids
from router.errors import bad_request, unavailable
from router.flow.pooling import embed_all, embed_request
from router.flow.request import Deadline
from router.routing.policy import Pools
from router.serve import begin_trail, end_trail
from router.state import RouterState
from router.usage import ANONYMOUS


async def embed(request: Request, state: RouterState, req: EmbeddingRequest) -> EmbeddingList:
    """The embeddings answer (OpenAI's CreateEmbeddingResponse); APIError otherwise."""
    arrived = time.monotonic()
    trail = begin_trail(request, state)
    key: str = getattr(request.state, "key_name", ANONYMOUS)
    try:
        if state.adapters.resolve(req.model, state.settings.model_name()) is not None:
            raise bad_request("embeddings are not served under a LoRA adapter", param="model")
        state.usage.admit(key)
        limit = state.settings.request_timeout_s
        trail.enter("admission")
        ticket = await state.admission.admit(req.priority, min(limit, req.timeout or limit))
    except BaseException as exc:
        end_trail(state, trail, exc)
        raise
    try:
        trail.enter("tokenize")
        prompts = await _token_ids(state, req)
        rid = f"embd-{uuid.uuid4().hex}"
        settings = state.settings
        pooling = req.pooling_type or settings.pooling_type
        normalize = settings.pooling_normalize if req.normalize is None else req.normalize
        calls = [
            embed_request(f"{rid}-{i}", ids, pooling, normalize, req.dimensions)
            for i, ids in enumerate(prompts)
        ]
        deadline = Deadline.within(arrived, req.timeout, limit)
        trail.enter("embed")
        answers = await embed_all(state, calls, deadline)
    except BaseException as exc:
        end_trail(state, trail, exc)
        raise
    finally:
        ticket.release()
    end_trail(state, trail, None)
    tokens = sum(a.num_prompt_tokens for a in answers)
    state.usage.charge(key, tokens, 0, 0)
    state.metrics.prompt_tokens.inc(tokens)
    vectors = [a.embedding for a in answers]
    return embedding_list(vectors, req.model, req.encoding_format, tokens)


async def _token_ids(state: RouterState, req: EmbeddingRequest) -> list[list[int]]:
    """Each input's token ids (a text is encoded with the tokenizer's special tokens), checked
    against the vocabulary and the context length; 400 naming `input` otherwise."""
    tokenizer = state.require_tokenizer()
    max_len = state.settings.max_model_len or Pools.of(state.membership.nodes()).max_model_len()
    if max_len is None:
        raise unavailable("no node is available", state.settings.retry_after_s)
    prompts = await asyncio.to_thread(_encode_all, tokenizer, req.inputs())
    for i, ids in enumerate(prompts):
        param = "input" if len(prompts) == 1 else f"input[{i}]"
        check_ids(tokenizer, ids, param)
        if not ids:
            raise bad_request("the input encodes to no tokens", param=param)
        if len(ids) > max_len:
            raise bad_request(
                f"the input has {len(ids)} tokens; the context length is {max_len}",
                param=param,
                code="context_length_exceeded",
            )
    return prompts


def _encode_all(tokenizer: Tokenizer, inputs: list[str | list[int]]) -> list[list[int]]:
    return [tokenizer.encode(x, True) if isinstance(x, str) else list(x) for x in inputs]
