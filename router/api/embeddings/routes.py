"""POST /v1/embeddings (router.embed computes the answer)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from router.api.embeddings.request import EmbeddingRequest
from router.api.parse import field_names, parse_request
from router.embed import embed
from router.endpoints import get_state, note_ignored, read_body, require_api_key

embeddings_routes = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])
ROUTE = "/v1/embeddings"
_NAMES = field_names(EmbeddingRequest)


@embeddings_routes.post("/embeddings")
async def embeddings(request: Request) -> JSONResponse:
    state = get_state(request)
    body = await read_body(request, state.settings.max_body_bytes)
    req: EmbeddingRequest = parse_request(EmbeddingRequest, body, _NAMES)
    note_ignored(state, ROUTE, req)
    answer = await embed(request, state, req)
    return JSONResponse(answer.model_dump())
