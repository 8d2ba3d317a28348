"""POST /tokenize and /detokenize, shaped as vLLM's: the router's tokenizer and chat template,
no node involved.

/tokenize takes either a text (`prompt`, special tokens added by default) or a conversation
(`messages`, rendered with the chat template, generation prompt added by default, `tools` as a
chat request renders them); it answers the ids, their count and the context length (null while
no node is known and --max-model-len is unset), and with `return_token_strs` each id's token
text. /detokenize answers the text of `tokens`. `model` is optional; when sent it must be the
served name. Both need the API key when one is set; bad input is a 400 in OpenAI's format.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from router.api.requests import ChatMessage, ToolDefinition
from router.api.tools import ToolPlan, template_messages
from router.endpoints import get_state, read_body, require_api_key
from router.errors import APIError, bad_request
from router.routing.policy import Pools
from router.state import RouterState

MAX_TOKEN_IDS = 1 << 17  # ids one /detokenize call may carry


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    model: str | None = None


class TokenizeCompletionRequest(_Body):
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    return_token_strs: bool = False
    tools: list[ToolDefinition] | None = Field(default=None, max_length=128)


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int | None
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(_Body):
    tokens: list[int] = Field(max_length=MAX_TOKEN_IDS)


class DetokenizeResponse(BaseModel):
    prompt: str


BodyT = TypeVar("BodyT", bound=_Body)
tokens = APIRouter(dependencies=[Depends(require_api_key)])


@tokens.post("/tokenize")
async def tokenize(request: Request) -> JSONResponse:
    state = get_state(request)
    raw = await read_body(request, state.settings.max_body_bytes)
    req = _parse_tokenize(raw)
    _check_model(state, req.model)
    tokenizer = state.require_tokenizer()
    if isinstance(req, TokenizeChatRequest):
        ids = await _chat_ids(state, req)
    else:
        ids = await asyncio.to_thread(tokenizer.encode, req.prompt, req.add_special_tokens)
    strs = [tokenizer.token_to_str(t) for t in ids] if req.return_token_strs else None
    max_len = state.settings.max_model_len or Pools.of(state.membership.nodes()).max_model_len()
    body = TokenizeResponse(count=len(ids), max_model_len=max_len, tokens=ids, token_strs=strs)
    return JSONResponse(body.model_dump())


@tokens.post("/detokenize")
async def detokenize(request: Request) -> JSONResponse:
    state = get_state(request)
    req = _parse(DetokenizeRequest, await read_body(request, state.settings.max_body_bytes))
    _check_model(state, req.model)
    tokenizer = state.require_tokenizer()
    bad = next((t for t in req.tokens if not 0 <= t < tokenizer.vocab_size), None)
    if bad is not None:
        raise bad_request(
            f"token id {bad} is outside the vocabulary [0, {tokenizer.vocab_size})",
            param="tokens",
            code="invalid_value",
        )
    text = await asyncio.to_thread(tokenizer.decode, req.tokens, False)
    return JSONResponse(DetokenizeResponse(prompt=text).model_dump())


async def _chat_ids(state: RouterState, req: TokenizeChatRequest) -> list[int]:
    """The ids of the conversation as /v1/chat/completions renders it."""
    tokenizer = state.require_tokenizer()
    plan = ToolPlan("auto", tuple(req.tools), None) if req.tools else None
    messages, tools = template_messages(req.messages, plan, tokenizer.chat_template_uses_tools)
    try:
        return await asyncio.to_thread(
            tokenizer.apply_chat_template, messages, req.add_generation_prompt, tools
        )
    except ValueError as exc:  # the template refused the conversation
        raise bad_request(str(exc), param="messages", code="invalid_messages") from None


def _parse_tokenize(raw: bytes) -> TokenizeCompletionRequest | TokenizeChatRequest:
    """The chat form when the body has `messages`, else the text form."""
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = None
    if isinstance(value, dict) and "messages" in value:
        return _parse(TokenizeChatRequest, raw)
    return _parse(TokenizeCompletionRequest, raw)


def _parse(cls: type[BodyT], raw: bytes) -> BodyT:
    """`raw` validated into `cls`, or a 400 naming the first bad parameter."""
    try:
        return cls.model_validate_json(raw)
    except ValidationError as exc:
        err = exc.errors(include_url=False, include_input=False)[0]
    if err["type"] == "json_invalid":
        raise bad_request(f"malformed JSON body: {err['msg']}", code="invalid_json")
    if not err["loc"]:
        raise bad_request("request body must be a JSON object", code="invalid_request")
    param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "missing":
        raise bad_request(f"missing required parameter '{param}'", param=param, code="missing")
    raise bad_request(f"invalid '{param}': {message}", param=param, code="invalid_value")


def _check_model(state: RouterState, model: str | None) -> None:
    served = state.settings.model_name()
    if model is not None and model != served:
        raise APIError(
            404,
            f"the model '{model}' does not exist; this router serves '{served}'",
            param="model",
            code="model_not_found",
        )
