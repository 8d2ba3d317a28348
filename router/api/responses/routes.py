"""POST /v1/responses, and GET / DELETE /v1/responses/{id} and its cancel.

A request becomes a chat completion request (`request.chat_request`) and runs the chat path
(`router.serve.serve`) with this API's dialect: the answer and the events are made from
the chat completion and its chunks. A stored response (`store`, the default) is kept with its
conversation for `previous_response_id` (router.response_store).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from router.api.objects import ChatCompletion
from router.api.parse import field_names, parse_request, to_api_error
from router.api.responses.objects import (
    DeletedResponse,
    ResponseObject,
    finished,
    new_id,
    output_items,
)
from router.api.responses.request import (
    ContentPart,
    FunctionTool,
    InputItem,
    NamedFunction,
    ResponsesRequest,
    TextFormat,
    TextOptions,
    chat_request,
    input_items,
)
from router.api.responses.stream import ResponseEvents
from router.endpoints import get_state, read_body, require_api_key
from router.errors import APIError
from router.response_store import ResponseStore
from router.serve import Generation, serve

responses_routes = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])
TEXT = {"type": "text"}
_NAMES = field_names(
    ResponsesRequest, InputItem, ContentPart, FunctionTool, NamedFunction, TextOptions, TextFormat
)


class _Dialect:
    """The Responses API's shape over one chat answer; stores the final response."""

    def __init__(
        self, shell: ResponseObject, store: ResponseStore | None, items: list[Any]
    ) -> None:
        self._shell = shell
        self._store = store
        self._items = items

    async def answer(self, completion: ChatCompletion, run: Generation) -> dict[str, Any]:
        finish = completion.choices[0].finish_reason
        final = finished(self._shell, output_items(completion), finish, completion.usage)
        await self._keep(final)
        return final.model_dump(mode="json")

    def events(self, chunks: AsyncIterator[BaseModel], run: Generation) -> AsyncIterator[bytes]:
        return ResponseEvents(self._shell, self._keep).stream(chunks)

    async def _keep(self, final: ResponseObject) -> None:
        if self._store is not None:
            record = {"response": final.model_dump(mode="json"), "input": self._items}
            await self._store.put(final.id, record)


def _store(request: Request) -> ResponseStore:
    store = get_state(request).responses
    if store is None:
        raise RuntimeError("the response store is made by create_app and is missing")
    return store


@responses_routes.post("/responses")
async def create_response(request: Request) -> Response:
    state = get_state(request)
    body = await read_body(request, state.settings.max_body_bytes)
    req: ResponsesRequest = parse_request(ResponsesRequest, body, _NAMES)
    req.refuse_unserved()
    store = _store(request)
    items: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        record = await store.get(req.previous_response_id, "previous_response_id")
        items = record["input"] + record["response"]["output"]
    items += input_items(req)
    try:
        chat = chat_request(req, items)
    except ValidationError as exc:
        raise to_api_error(exc) from None
    shell = ResponseObject(
        id=new_id("resp"), model=req.model, status="in_progress", instructions=req.instructions,
        metadata=req.metadata or {}, parallel_tool_calls=req.parallel_tool_calls is not False,
        tool_choice=_shown(req.tool_choice or "auto"), tools=[_shown(t) for t in req.tools or []],
        temperature=req.temperature, top_p=req.top_p, max_output_tokens=req.max_output_tokens,
        previous_response_id=req.previous_response_id, store=req.store,
        text={"format": _shown(req.text.format if req.text and req.text.format else TEXT)},
    )  # fmt: skip
    return await serve(
        request, state, chat, "chat", _Dialect(shell, store if req.store else None, items)
    )


def _shown(value: Any) -> Any:
    return (
        value.model_dump(exclude_none=True, by_alias=True)
        if isinstance(value, BaseModel)
        else value
    )


@responses_routes.get("/responses/{response_id}")
async def get_response(request: Request, response_id: str) -> JSONResponse:
    record = await _store(request).get(response_id)
    return JSONResponse(record["response"])


@responses_routes.delete("/responses/{response_id}")
async def delete_response(request: Request, response_id: str) -> JSONResponse:
    if not await _store(request).delete(response_id):
        raise APIError(404, f"no stored response {response_id!r}", code="response_not_found")
    return JSONResponse(DeletedResponse(id=response_id).model_dump())


@responses_routes.post("/responses/{response_id}/cancel")
async def cancel_response(request: Request, response_id: str) -> JSONResponse:
    """Only a background response can be cancelled, and this router runs every response in
    the foreground: a stored one is answered as it is, finished."""
    record = await _store(request).get(response_id)
    raise APIError(
        400,
        f"response {response_id!r} is {record['response']['status']}: only a background "
        "response can be cancelled, and this server runs none",
        code="not_cancellable",
    )
