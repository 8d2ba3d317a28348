"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API).

A request becomes a chat completion request (`request.chat_request`) and runs the chat path
(`router.serve.serve`) with this API's dialect: the message and its events are made from
the chat completion and its chunks. Errors on these paths answer in Anthropic's error shape
(router.app picks it by path; router.api.messages.errors).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from router.api.messages.objects import (
    MessageObject,
    MessageUsage,
    TokenCount,
    message_of,
    new_id,
)
from router.api.messages.request import (
    ContentBlock,
    CountTokensRequest,
    InputMessage,
    MessagesRequest,
    TextBlock,
    Thinking,
    Tool,
    ToolChoice,
    chat_request,
)
from router.api.messages.stream import MessageEvents
from router.api.objects import ChatCompletion
from router.api.parse import field_names, parse_request, to_api_error
from router.api.prompt import chat_prompt
from router.api.requests import ChatCompletionRequest
from router.api.tools import plan_tools
from router.endpoints import get_state, note_ignored, read_body, require_api_key
from router.serve import Generation, serve

PREFIX = "/v1/messages"
messages_routes = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])
_NAMES = field_names(
    MessagesRequest, InputMessage, ContentBlock, TextBlock, Tool, ToolChoice, Thinking
)


class _Dialect:
    """The Messages API's shape over one chat answer."""

    def __init__(self, model: str) -> None:
        self._model = model

    async def answer(self, completion: ChatCompletion, run: Generation) -> dict[str, Any]:
        message = message_of(completion, self._model, run.output.stop_string)
        return message.model_dump(mode="json")

    def events(self, chunks: AsyncIterator[BaseModel], run: Generation) -> AsyncIterator[bytes]:
        usage = MessageUsage.of(run.prompt).model_copy(update={"output_tokens": 0})
        shell = MessageObject(id=new_id(), model=self._model, content=[], usage=usage)
        return MessageEvents(shell, lambda: run.output.stop_string).stream(chunks)


@messages_routes.post("/messages")
async def create_message(request: Request) -> Response:
    state = get_state(request)
    body = await read_body(request, state.settings.max_body_bytes)
    req: MessagesRequest = parse_request(MessagesRequest, body, _NAMES)
    note_ignored(state, PREFIX, req)
    return await serve(request, state, _chat(req), "chat", _Dialect(req.model))


@messages_routes.post("/messages/count_tokens")
async def count_tokens(request: Request) -> JSONResponse:
    """The prompt's tokens, as the chat template renders the conversation and its tools."""
    state = get_state(request)
    body = await read_body(request, state.settings.max_body_bytes)
    req: CountTokensRequest = parse_request(CountTokensRequest, body, _NAMES)
    note_ignored(state, PREFIX + "/count_tokens", req)
    chat = _chat(req)
    state.adapters.resolve(req.model, state.settings.model_name())  # 404 for another model
    prompt = await chat_prompt(state.require_tokenizer(), chat, plan_tools(chat))
    return JSONResponse(TokenCount(input_tokens=len(prompt.token_ids)).model_dump())


def _chat(req: CountTokensRequest) -> ChatCompletionRequest:
    req.refuse_unserved()
    try:
        return chat_request(req)
    except ValidationError as exc:
        raise to_api_error(exc) from None
