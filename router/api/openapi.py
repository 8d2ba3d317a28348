"""The router's OpenAPI document (/openapi.json, browsable at /docs).

The endpoints read and validate their bodies themselves (router.endpoints: size limit, OpenAI
error format), so FastAPI sees no body parameter to describe. This module completes the
document FastAPI builds from the routes: each POST gets its request model, every operation
its answers (the JSON or event-stream body of a 200, and each error status with OpenAI's error
object), and, when API keys are set, bearer security on the endpoints that need a key.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from cluster.protocol import LoadAdapterRequest
from router.api.embeddings.request import EmbeddingList, EmbeddingRequest
from router.api.messages.objects import MessageObject, TokenCount
from router.api.messages.request import CountTokensRequest, MessagesRequest
from router.api.objects import ChatCompletion, ChatCompletionChunk, Completion, ModelList
from router.api.requests import ChatCompletionRequest, CompletionRequest
from router.api.responses.objects import DeletedResponse, ResponseObject
from router.api.responses.request import ResponsesRequest
from router.api.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
)

REF = "#/components/schemas/{model}"
DESCRIPTION = (
    "The OpenAI-compatible API of a splitserve cluster (chat completions, completions, "
    "embeddings, models, responses), Anthropic's messages, vLLM's /tokenize and /detokenize "
    "and LoRA adapter loading, and the probes. Errors are OpenAI's error object (Anthropic's on "
    "/v1/messages)."
)
Names = dict[Any, dict[str, Any]]  # model -> its {"$ref": ...} in the components


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every error the router answers: OpenAI's error object."""

    error: ErrorDetail


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """Every error of the Messages API's paths: Anthropic's error object."""

    type: Literal["error"]
    error: AnthropicErrorDetail


class ReadyResponse(BaseModel):
    status: Literal["ready", "not_ready"]
    prefill_nodes: int
    decode_nodes: int
    colocated_nodes: int


class HealthResponse(BaseModel):
    status: Literal["ok"]


class VersionResponse(BaseModel):
    version: str
    python: str


class AdapterResponse(BaseModel):
    """A LoRA adapter loaded on (or unloaded from) every node."""

    status: Literal["ok"]
    lora_name: str


_MODELS: list[tuple[type[BaseModel], JsonSchemaMode]] = [
    (ChatCompletionRequest, "validation"),
    (CompletionRequest, "validation"),
    (TokenizeCompletionRequest, "validation"),
    (TokenizeChatRequest, "validation"),
    (DetokenizeRequest, "validation"),
    (ChatCompletion, "serialization"),
    (ChatCompletionChunk, "serialization"),
    (Completion, "serialization"),
    (ModelList, "serialization"),
    (TokenizeResponse, "serialization"),
    (DetokenizeResponse, "serialization"),
    (ErrorResponse, "serialization"),
    (ReadyResponse, "serialization"),
    (HealthResponse, "serialization"),
    (VersionResponse, "serialization"),
    (LoadAdapterRequest, "validation"),
    (AdapterResponse, "serialization"),
    (ResponsesRequest, "validation"),
    (ResponseObject, "serialization"),
    (DeletedResponse, "serialization"),
    (MessagesRequest, "validation"),
    (CountTokensRequest, "validation"),
    (MessageObject, "serialization"),
    (TokenCount, "serialization"),
    (AnthropicErrorResponse, "serialization"),
    (EmbeddingRequest, "validation"),
    (EmbeddingList, "serialization"),
]


def _typed_events() -> dict[str, Any]:
    """One event of the Responses or Messages API's stream: `event: TYPE`, its JSON `data`."""
    data = {"type": "string", "contentMediaType": "application/json"}
    return {
        "type": "object",
        "required": ["event", "data"],
        "properties": {"event": {"type": "string"}, "data": data},
    }


def _events(chunk: type[BaseModel]) -> dict[str, Any]:
    """One server-sent event of a stream (Open API before 3.2 has `schema` describe each
    event): a chunk or an error object as JSON, and `[DONE]` last."""
    payload = {"anyOf": [chunk, ErrorResponse]}
    data = {"type": "string", "contentMediaType": "application/json", "contentSchema": payload}
    return {
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"anyOf": [{"const": "[DONE]"}, data]}},
    }


_ERRORS = {
    400: "bad input (the error names the parameter)",
    401: "missing or invalid API key (when keys are set)",
    403: "the API key may not read this (usage_admin_keys)",
    404: "the model (or adapter) is not one this router serves",
    408: "the request ran past its own `timeout`",
    413: "the body is larger than the router takes",
    429: "overloaded: the queue is full (Retry-After)",
    500: "internal error",
    503: "no healthy node (Retry-After)",
    504: "the request ran past the router's deadline",
}
_GENERATE_ERRORS = (400, 401, 404, 408, 413, 429, 500, 503, 504)
_TOKENS_ERRORS = (400, 401, 404, 413, 500, 503)
# (path, method) -> (request model, {media type: 200 body model or schema}, error statuses)
_OPERATIONS: dict[tuple[str, str], tuple[Any, dict[str, Any], tuple[int, ...]]] = {
    ("/v1/chat/completions", "post"): (
        ChatCompletionRequest,
        {"application/json": ChatCompletion, "text/event-stream": _events(ChatCompletionChunk)},
        _GENERATE_ERRORS,
    ),
    ("/v1/completions", "post"): (
        CompletionRequest,
        {"application/json": Completion, "text/event-stream": _events(Completion)},
        _GENERATE_ERRORS,
    ),
    ("/v1/responses", "post"): (
        ResponsesRequest,
        {"application/json": ResponseObject, "text/event-stream": _typed_events()},
        _GENERATE_ERRORS,
    ),
    ("/v1/responses/{response_id}", "get"): (
        None,
        {"application/json": ResponseObject},
        (401, 404, 500, 503),
    ),
    ("/v1/responses/{response_id}", "delete"): (
        None,
        {"application/json": DeletedResponse},
        (401, 404, 500, 503),
    ),
    ("/v1/responses/{response_id}/cancel", "post"): (
        None,
        {"application/json": ResponseObject},
        (400, 401, 404, 500, 503),
    ),
    ("/v1/messages", "post"): (
        MessagesRequest,
        {"application/json": MessageObject, "text/event-stream": _typed_events()},
        _GENERATE_ERRORS,
    ),
    ("/v1/messages/count_tokens", "post"): (
        CountTokensRequest,
        {"application/json": TokenCount},
        _TOKENS_ERRORS,
    ),
    ("/v1/embeddings", "post"): (
        EmbeddingRequest,
        {"application/json": EmbeddingList},
        _GENERATE_ERRORS,
    ),
    ("/v1/models", "get"): (None, {"application/json": ModelList}, (401, 500)),
    ("/tokenize", "post"): (
        (TokenizeCompletionRequest, TokenizeChatRequest),
        {"application/json": TokenizeResponse},
        _TOKENS_ERRORS,
    ),
    ("/detokenize", "post"): (
        DetokenizeRequest,
        {"application/json": DetokenizeResponse},
        _TOKENS_ERRORS,
    ),
    ("/v1/load_lora_adapter", "post"): (
        LoadAdapterRequest,
        {"application/json": AdapterResponse},
        (400, 401, 413, 500, 503),
    ),
    ("/v1/unload_lora_adapter", "post"): (
        LoadAdapterRequest,
        {"application/json": AdapterResponse},
        (400, 401, 404, 413, 500, 503),
    ),
    ("/health", "get"): (None, {"application/json": HealthResponse}, ()),
    ("/ready", "get"): (None, {"application/json": ReadyResponse}, ()),
    ("/metrics", "get"): (None, {"text/plain": {"type": "string"}}, ()),
    ("/version", "get"): (None, {"application/json": VersionResponse}, ()),
    ("/debug/requests/{request_id}", "get"): (
        None,
        {"application/json": {"type": "object"}},
        (401, 403, 404, 500),
    ),
}
_KEYED = ("/v1/", "/tokenize", "/detokenize", "/debug/")
# a request that generates, per endpoint (the served model's name added)
_EXAMPLES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8},
    "/v1/completions": {"prompt": "The capital of France is", "max_tokens": 8},
    "/v1/responses": {"input": "Hello!", "max_output_tokens": 8},
    "/v1/messages": {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8},
    "/v1/messages/count_tokens": {"messages": [{"role": "user", "content": "Hello!"}]},
    "/v1/embeddings": {"input": "The capital of France is Paris."},
}
_ANTHROPIC = "/v1/messages"  # paths answering Anthropic's error object


def install_openapi(app: FastAPI, keyed: bool, model: str = "") -> None:
    """Serve the completed document; `keyed`: the router requires an API key; `model`: the
    served model's name, in the request examples."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_document(app, keyed, model)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def build_document(app: FastAPI, keyed: bool, model: str = "") -> dict[str, Any]:
    doc = get_openapi(
        title=app.title,
        version=app.version,
        description=DESCRIPTION,
        routes=app.routes,
    )
    refs, defs = models_json_schema(_MODELS, ref_template=REF)
    names = {model: ref for (model, _), ref in refs.items()}
    components = doc.setdefault("components", {})
    components["schemas"] = defs.get("$defs", {})
    if keyed:
        components["securitySchemes"] = {
            "apiKey": {"type": "http", "scheme": "bearer"},
            "xApiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
        }
    for (path, method), (body, ok, errors) in _OPERATIONS.items():
        operation = doc["paths"].get(path, {}).get(method)
        if operation is None:
            continue
        if body is not None:
            media = {"schema": _schema(body, names)}
            if path in _EXAMPLES and model:
                media["example"] = {"model": model, **_EXAMPLES[path]}
            operation["requestBody"] = {"required": True, "content": {"application/json": media}}
        answers = {"200": _answer("OK", ok, names)}
        if path == "/ready":
            answers["503"] = _answer("not ready", {"application/json": ReadyResponse}, names)
        anthropic = path.startswith(_ANTHROPIC)
        for status in errors:
            if status != 401 or keyed:
                content = {
                    "application/json": AnthropicErrorResponse if anthropic else ErrorResponse
                }
                answers[str(status)] = _answer(_ERRORS[status], content, names)
        operation["responses"] = answers
        if keyed and path.startswith(_KEYED):
            operation["security"] = [{"apiKey": []}, {"xApiKey": []}]
    return doc


def _answer(description: str, content: dict[str, Any], names: Names) -> dict[str, Any]:
    return {
        "description": description,
        "content": {media: {"schema": _schema(body, names)} for media, body in content.items()},
    }


def _schema(body: Any, names: Names) -> Any:
    """A model's reference in the components, any of several, or a schema with models in it."""
    if isinstance(body, tuple):
        return {"anyOf": [_schema(b, names) for b in body]}
    if isinstance(body, type) and issubclass(body, BaseModel):
        return dict(names[body])
    if isinstance(body, dict):
        return {k: _schema(v, names) for k, v in body.items()}
    if isinstance(body, list):
        return [_schema(v, names) for v in body]
    return body
