"""The shared path of every generating endpoint: admission, the prompt and its sampling
parameters, the cluster flow, usage charged to the key, and the answer (streamed or not),
optionally in another API's shape (a `Dialect`)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from cluster.tracing import now_ns
from models.tokenizer import Tokenizer
from router.api.choices import Samples
from router.api.harmony import HarmonySplitter, reads_harmony
from router.api.objects import ChatCompletion, Usage
from router.api.prompt import chat_prompt, completion_prompt, resolve_max_tokens, sampling_params
from router.api.reasoning import Splitter, splitter_for
from router.api.render import ChatFormatter, CompletionFormatter, Formatter
from router.api.render_samples import serve_samples
from router.api.requests import ChatCompletionRequest, CompletionRequest, SamplingRequest
from router.api.streaming import EventStreamResponse, chat_chunks, collect, sse_events, usage_of
from router.api.structured import response_format_grammar
from router.api.text_deltas import OutputProcessor
from router.api.tool_answers import ToolChatFormatter
from router.api.tool_parsers import parser_for
from router.api.tools import plan_tools
from router.disconnect import until_disconnect
from router.errors import APIError, unavailable
from router.flow.request import FlowRequest
from router.flow.request_flow import RequestFlow
from router.routing.policy import Pools
from router.state import RouterState
from router.trail import Trail
from router.usage import ANONYMOUS


@dataclass(frozen=True)
class Generation:
    """What a dialect reads besides the chat answer: the usage once the prompt was in (its
    tokens, the cached ones) and the output's text state (the stop string that ended it)."""

    prompt: Usage
    output: OutputProcessor


class Dialect(Protocol):
    """Another API's shape over a chat completion (the Responses API, Anthropic's Messages):
    its answer and its event stream, made from the chat path's."""

    async def answer(self, completion: ChatCompletion, run: Generation) -> dict[str, Any]: ...

    def events(self, chunks: AsyncIterator[BaseModel], run: Generation) -> AsyncIterator[bytes]:
        """The SSE body from the chat chunks (usage last); it answers failures itself."""
        ...


async def serve(
    request: Request,
    state: RouterState,
    req: SamplingRequest,
    kind: Literal["chat", "completion"],
    dialect: Dialect | None = None,
) -> Response:
    """Shared path of every generating endpoint, streaming or not; `dialect` (one sample of a
    chat) answers in another API's shape."""
    arrived = time.monotonic()
    trail = begin_trail(request, state)
    key: str = getattr(request.state, "key_name", ANONYMOUS)
    try:
        lora = state.adapters.resolve(req.model, state.settings.model_name())
        state.usage.admit(key)  # 429 for a key over its limits, before any work
        limit = state.settings.request_timeout_s
        wait_s = min(limit, req.timeout) if req.timeout else limit
        trail.enter("admission")
        ticket = await state.admission.admit(req.priority, wait_s)
    except BaseException as exc:
        end_trail(state, trail, exc)
        raise
    try:
        trail.enter("tokenize")
        flow_req, outputs, fmt = await _prepare(state, req, kind, arrived)
        flow_req = replace(flow_req, lora=lora)
    except BaseException as exc:
        ticket.release()
        end_trail(state, trail, exc)
        raise
    state.requests.name(trail, flow_req.request_id)
    if req.num_samples() > 1:
        trail.enter("samples")
        samples = _ChargedSamples(
            key, state, flow_req, ticket, outputs, req.num_samples(),
            need_logprobs=req.num_samples() > req.num_choices(), trail=trail,
        )  # fmt: skip
        return await serve_samples(
            request, samples, fmt, req.num_choices(), req.stream, req.include_usage()
        )
    flow, output = RequestFlow(state, flow_req, ticket, trail=trail), outputs()
    charge = _charger(state, key, lambda: usage_of(flow, output))

    async def close() -> None:
        try:
            await flow.close()
        finally:
            charge()

    try:
        await flow.start()
    except BaseException:
        await close()
        raise
    if req.stream and dialect is not None:
        chunks = chat_chunks(flow, output, fmt, include_usage=True)
        events = dialect.events(chunks, Generation(usage_of(flow, output), output))
        return EventStreamResponse(events, on_close=close)
    if req.stream:
        events = sse_events(flow, output, fmt, req.include_usage())
        return EventStreamResponse(events, on_close=close)
    try:
        deltas = await until_disconnect(request, collect(flow, output))
    finally:
        await close()
    if deltas is None:  # the client left; nobody reads this
        return Response(status_code=499)
    answer = fmt.response(deltas, usage_of(flow, output))
    if dialect is not None and isinstance(answer, ChatCompletion):
        run = Generation(usage_of(flow, output), output)
        return JSONResponse(await dialect.answer(answer, run))
    return JSONResponse(answer.model_dump())


def _charger(state: RouterState, key: str, usage: Callable[[], Usage]) -> Callable[[], None]:
    """Charges `key` once with the usage the response reports, when tokens were generated
    (a request that failed before its first token costs nothing)."""
    charged = False

    def charge() -> None:
        nonlocal charged
        u = usage()
        if charged or u.completion_tokens == 0:
            return
        charged = True
        cached = u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else 0
        state.usage.charge(key, u.prompt_tokens, u.completion_tokens, cached)

    return charge


class _ChargedSamples(Samples):
    """Samples that charge `key` with their usage when closed, however the answer ended."""

    def __init__(self, key: str, state: RouterState, *args: Any, trail: Trail, **kw: Any) -> None:
        kw["trail"] = trail
        super().__init__(state, *args, **kw)
        self._charge = _charger(state, key, self.usage)
        self._trail, self._state = trail, state

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            self._charge()
            end_trail(self._state, self._trail, None)


def begin_trail(request: Request, state: RouterState) -> Trail:
    """The request's trail since the RequestIds middleware stamped its arrival."""
    scope = request.state
    rid = getattr(scope, "request_id", None) or uuid.uuid4().hex
    arrived = getattr(scope, "arrived_ns", None) or now_ns()
    trail = Trail.begin(state.tracer, rid, request.headers, arrived)
    state.requests.add(trail)
    return trail


def end_trail(state: RouterState, trail: Trail, exc: BaseException | None) -> None:
    """Finish a trail that no flow finishes: ok, or the error that ended the request."""
    if exc is None:
        trail.finish("ok")
    elif isinstance(exc, APIError):
        trail.finish(exc.code or str(exc.status))
    else:
        trail.finish(type(exc).__name__)
    state.requests.done(trail)


async def _prepare(
    state: RouterState,
    req: SamplingRequest,
    kind: Literal["chat", "completion"],
    arrived: float,
) -> tuple[FlowRequest, Callable[[], OutputProcessor], Formatter]:
    """The request for the cluster, a maker of its output's text state, and its formatter."""
    tokenizer = state.require_tokenizer()
    max_len = state.settings.max_model_len or Pools.of(state.membership.nodes()).max_model_len()
    if max_len is None:
        raise unavailable("no node is available", state.settings.retry_after_s)
    plan, grammar = None, None
    if isinstance(req, ChatCompletionRequest):
        plan = plan_tools(req)
        grammar = plan.grammar if plan is not None else None
        grammar = grammar or response_format_grammar(req.response_format)
        prompt = await chat_prompt(tokenizer, req, plan)
        requested, param = req.requested_max_tokens()
        logprobs = req.requested_logprobs()
    elif isinstance(req, CompletionRequest):
        prompt = await completion_prompt(tokenizer, req)
        requested, param, logprobs = req.max_tokens, "max_tokens", req.logprobs
    else:
        raise TypeError(f"unexpected request type {type(req).__name__}")
    max_tokens = resolve_max_tokens(prompt, requested, param, max_len)
    sampling = sampling_params(tokenizer, req, max_tokens, logprobs, grammar)
    if grammar is not None:
        state.metrics.constrained_requests.inc()
    request_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
    flow_req = FlowRequest(
        request_id, prompt.token_ids, sampling, arrived, req.priority, req.timeout
    )
    stops, kwargs = req.stop_strings(), getattr(req, "chat_template_kwargs", None)
    settings = state.settings
    thinking_parser = settings.reasoning_parser if kind == "chat" else None
    harmony = kind == "chat" and reads_harmony(
        tokenizer, settings.reasoning_parser, settings.tool_call_parser
    )

    def outputs() -> OutputProcessor:
        thinking: Splitter | None
        if harmony and grammar is None:
            thinking = HarmonySplitter(thinking_parser == "gpt_oss", plan is not None)
        else:
            thinking = splitter_for(thinking_parser, prompt.text, kwargs, grammar is not None)
        return OutputProcessor(tokenizer, prompt.token_ids, stops, thinking)

    fmt: Formatter
    if isinstance(req, CompletionRequest):
        echo = None
        if req.echo:
            echo = (await _prompt_text(tokenizer, req, prompt.token_ids), prompt.token_ids)
        fmt = CompletionFormatter(request_id, req.model, tokenizer, logprobs, echo)
    elif plan is not None:
        parser = parser_for(settings.tool_call_parser, tokenizer.chat_template, harmony)
        fmt = ToolChatFormatter(plan, parser, request_id, req.model, tokenizer, logprobs)
    else:
        fmt = ChatFormatter(request_id, req.model, tokenizer, logprobs)
    return flow_req, outputs, fmt


async def _prompt_text(tokenizer: Tokenizer, req: CompletionRequest, ids: list[int]) -> str:
    """The prompt as echo shows it: the text sent, or the token ids decoded."""
    prompt = req.single_prompt()
    if isinstance(prompt, str):
        return prompt
    return await asyncio.to_thread(tokenizer.decode, ids, False)
