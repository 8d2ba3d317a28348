"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's bodies: lora_name,
lora_path): the router asks every node of both pools and answers once all have: 200 when
every node loaded the adapter, 400 naming the file when a node refused it (the adapter is not
registered, the cluster keeps serving), 503 when a node could not be reached."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from cluster.protocol import INTERNAL_LORA_LOAD, INTERNAL_LORA_UNLOAD, LoadAdapterRequest
from router.endpoints import get_state, read_body, require_api_key
from router.errors import APIError, bad_request, unavailable
from router.node_client import NodeCallError
from router.state import RouterState

lora_routes = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])


@lora_routes.post("/load_lora_adapter")
async def load_lora_adapter(request: Request) -> JSONResponse:
    state = get_state(request)
    body = await _body(request, state)
    if not body.lora_path:
        raise bad_request("lora_path is required", "lora_path")
    if body.lora_name == state.settings.model_name():
        raise bad_request(f"'{body.lora_name}' is the base model's name", "lora_name")
    await _every_node(state, INTERNAL_LORA_LOAD, body)
    state.adapters.add(body.lora_name, body.lora_path)
    return JSONResponse({"status": "ok", "lora_name": body.lora_name})


@lora_routes.post("/unload_lora_adapter")
async def unload_lora_adapter(request: Request) -> JSONResponse:
    state = get_state(request)
    body = await _body(request, state)
    if not state.adapters.remove(body.lora_name):
        raise APIError(
            404, f"no LoRA adapter '{body.lora_name}' is loaded", param="lora_name",
            code="model_not_found",
        )  # fmt: skip
    await _every_node(state, INTERNAL_LORA_UNLOAD, body)
    return JSONResponse({"status": "ok", "lora_name": body.lora_name})


async def _body(request: Request, state: RouterState) -> LoadAdapterRequest:
    raw = await read_body(request, state.settings.max_body_bytes)
    try:
        return LoadAdapterRequest.model_validate_json(raw)
    except ValueError:
        raise bad_request("the body must be {'lora_name': str, 'lora_path': str}") from None


async def _every_node(state: RouterState, path: str, body: LoadAdapterRequest) -> None:
    nodes = [record.info for record in state.membership.nodes()]
    if not nodes:
        raise unavailable("no node is available", state.settings.retry_after_s)
    client = state.require_nodes()
    results = await asyncio.gather(
        *(client.lora(node, path, body) for node in nodes), return_exceptions=True
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    refused = [e for e in errors if isinstance(e, NodeCallError) and e.kind == "refused"]
    if refused:
        info = refused[0].info
        raise bad_request(info.message if info else str(refused[0]), "lora_path")
    if errors:
        raise unavailable(f"not every node answered: {errors[0]}", state.settings.retry_after_s)
