"""From a validated OpenAI request to what nodes take: prompt token ids and SamplingParams.

Tokenization and chat templates run in a worker thread (they are CPU work).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from models.chat_template import RESERVED
from models.sampling_params import SamplingParams
from models.tokenizer import Tokenizer
from router.api.harmony import uses_harmony
from router.api.harmony_render import EFFORTS, HarmonyPrompt, render_harmony
from router.api.requests import ChatCompletionRequest, CompletionRequest, SamplingRequest
from router.api.structured import response_format_instruction
from router.api.tools import ToolPlan, template_messages, with_system_text
from router.errors import bad_request

T = TypeVar("T")
_DEFAULT = SamplingParams()  # what a request leaves out: OpenAI's defaults


@dataclass(frozen=True)
class Prompt:
    """Token ids of a prompt, the parameter name to blame if it is too long, and the text a
    chat template rendered (empty for a completion's prompt)."""

    token_ids: list[int]
    param: str
    text: str = ""


async def completion_prompt(tokenizer: Tokenizer, req: CompletionRequest) -> Prompt:
    prompt = req.single_prompt()
    if isinstance(prompt, str):
        ids = await asyncio.to_thread(tokenizer.encode, prompt, True)
    else:
        ids = list(prompt)
        check_ids(tokenizer, ids, "prompt")
    if not ids:
        raise bad_request("the prompt is empty", param="prompt", code="empty_prompt")
    return Prompt(ids, "prompt")


async def chat_prompt(
    tokenizer: Tokenizer, req: ChatCompletionRequest, plan: ToolPlan | None = None
) -> Prompt:
    """The chat's prompt: a harmony model's rendered by router.api.harmony_render, any
    other's by its chat template."""
    instruction = response_format_instruction(req.response_format)
    variables = req.chat_template_kwargs or {}
    reserved = sorted(RESERVED.intersection(variables))
    if reserved:
        raise bad_request(
            f"chat_template_kwargs may not set '{reserved[0]}': the server sets it",
            param=f"chat_template_kwargs.{reserved[0]}",
        )
    if uses_harmony(tokenizer):
        try:
            text = render_harmony(req.messages, _harmony_prompt(plan, instruction, variables))
        except ValueError as exc:
            raise bad_request(str(exc), param="messages", code="invalid_messages") from None
        ids = await asyncio.to_thread(tokenizer.encode, text, False)
        return _checked(Prompt(ids, "messages", text))
    messages, tools = template_messages(req.messages, plan, tokenizer.chat_template_uses_tools)
    if instruction is not None:
        messages = with_system_text(messages, instruction)
    render = _continued if req.continue_final_message else _render
    try:
        text, ids = await asyncio.to_thread(render, tokenizer, messages, tools, variables)
    except ValueError as exc:  # the template refused the conversation
        raise bad_request(str(exc), param="messages", code="invalid_messages") from None
    return _checked(Prompt(ids, "messages", text))


def _checked(prompt: Prompt) -> Prompt:
    if not prompt.token_ids:
        raise bad_request("the messages render to an empty prompt", param="messages")
    return prompt


def _harmony_prompt(
    plan: ToolPlan | None, instruction: str | None, variables: dict[str, Any]
) -> HarmonyPrompt:
    """What a harmony prompt holds besides the messages; chat_template_kwargs may set
    `reasoning_effort` (low, medium, high), as gpt-oss's own template reads it."""
    effort = variables.get("reasoning_effort", "medium")
    if effort not in EFFORTS:
        raise bad_request(
            f"reasoning_effort must be one of {', '.join(EFFORTS)}, got {str(effort)[:20]!r}",
            param="chat_template_kwargs.reasoning_effort",
        )
    tools = plan.tools if plan is not None else ()
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    return HarmonyPrompt(tools, instruction, effort, today)


def _render(
    tokenizer: Tokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    variables: dict[str, Any],
) -> tuple[str, list[int]]:
    text = tokenizer.render_chat(messages, True, tools, variables)
    return text, tokenizer.encode(text, add_special_tokens=False)


def _continued(
    tokenizer: Tokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    variables: dict[str, Any],
) -> tuple[str, list[int]]:
    """The conversation rendered up to the end of its final message's text, so that the
    answer continues that message (no end of turn, no generation prompt after it)."""
    text = tokenizer.render_chat(messages, False, tools, variables)
    final = messages[-1].get("content")
    if not isinstance(final, str) or messages[-1].get("tool_calls"):
        raise ValueError("only a text message can be continued")
    for tail in (final, final.rstrip()):  # templates may strip the content they render
        at = text.rfind(tail)
        if tail and at >= 0:
            text = text[: at + len(tail)]
            return text, tokenizer.encode(text, add_special_tokens=False)
    raise ValueError("the chat template does not render the final message's text as sent")


def check_ids(tokenizer: Tokenizer, ids: list[int], param: str) -> None:
    vocab = tokenizer.vocab_size
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise bad_request(f"token id {bad} is outside the vocabulary [0, {vocab})", param=param)


def resolve_max_tokens(
    prompt: Prompt, requested: int | None, param: str, max_model_len: int
) -> int:
    """The output budget: `requested`, or all the room left when None.

    Raises 400 naming `prompt.param` when the prompt leaves no room, or `param` when
    prompt + requested exceeds the context length.
    """
    n = len(prompt.token_ids)
    if n >= max_model_len:
        raise bad_request(
            f"the prompt has {n} tokens; the context length is {max_model_len}, "
            "which leaves no room for output",
            param=prompt.param,
            code="context_length_exceeded",
        )
    if requested is None:
        return max_model_len - n
    if n + requested > max_model_len:
        raise bad_request(
            f"prompt ({n} tokens) + {param} ({requested}) exceeds the context length "
            f"of {max_model_len}",
            param=param,
            code="context_length_exceeded",
        )
    return requested


def sampling_params(
    tokenizer: Tokenizer,
    req: SamplingRequest,
    max_tokens: int,
    logprobs: int | None,
    grammar: str | None = None,
) -> SamplingParams:
    """The request's SamplingParams, with SamplingParams' defaults for what it leaves out.
    These go to the nodes as they are."""
    stop_ids = list(req.stop_token_ids or [])
    check_ids(tokenizer, stop_ids, "stop_token_ids")
    bias = req.logit_bias_pairs()
    check_ids(tokenizer, [t for t, _ in bias], "logit_bias")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_or(req.temperature, _DEFAULT.temperature),
        top_p=_or(req.top_p, _DEFAULT.top_p),
        top_k=_or(req.top_k, _DEFAULT.top_k),
        min_p=_or(req.min_p, _DEFAULT.min_p),
        seed=req.seed,
        presence_penalty=_or(req.presence_penalty, _DEFAULT.presence_penalty),
        frequency_penalty=_or(req.frequency_penalty, _DEFAULT.frequency_penalty),
        repetition_penalty=_or(req.repetition_penalty, _DEFAULT.repetition_penalty),
        stop_token_ids=tuple(stop_ids),
        ignore_eos=req.ignore_eos,
        logprobs=logprobs,
        logit_bias=bias,
        grammar=grammar,
    )


def _or(value: T | None, default: T) -> T:
    return default if value is None else value
