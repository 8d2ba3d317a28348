"""OpenAI API request models (the subset the router serves; responses: router.api.objects).

Requests validate strictly (a string is not a number) and ignore unknown fields, as OpenAI
clients send extras (their names are logged and counted: router.api.ignored). Features the
router does not implement are refused with a 400 naming the field rather than silently
ignored: suffix. Bodies are parsed, and their errors named, by router.api.parse.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from cluster.protocol import PRIORITY_LIMIT
from router.api.ignored import NotesIgnored

MAX_LOGIT_BIAS = 300  # logit_bias entries a request may carry, as OpenAI allows
MAX_CHOICES = 16  # the most samples (n, best_of) one request may ask for


def check_stops(stops: list[str] | None) -> None:
    """At most 16 stop strings of 1 to 256 characters (ValueError otherwise)."""
    if len(stops or []) > 16:
        raise ValueError("at most 16 stop strings")
    if any(not s or len(s) > 256 for s in stops or []):
        raise ValueError("stop strings must be 1 to 256 characters")


class _Request(NotesIgnored):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class StreamOptions(_Request):
    include_usage: bool = False


class SamplingFields(_Request):
    """The sampling fields every generating endpoint takes (chat, completions, responses)."""

    model: str
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    user: str | None = None
    # splitserve extensions: lower priority is served first (as vLLM's); timeout caps the
    # router's request deadline, in seconds
    priority: int = Field(default=0, ge=-PRIORITY_LIMIT, le=PRIORITY_LIMIT)
    timeout: float | None = Field(default=None, gt=0, le=86400)


class SamplingRequest(SamplingFields):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    stream_options: StreamOptions | None = None
    n: int | None = Field(default=1, ge=1, le=MAX_CHOICES)
    max_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(default=None, max_length=64)
    ignore_eos: bool = False
    logit_bias: dict[str, float] | None = Field(default=None, max_length=MAX_LOGIT_BIAS)

    @field_validator("stop")
    @classmethod
    def _stops_are_short_and_nonempty(cls, value: str | list[str] | None) -> str | list[str] | None:
        check_stops([value] if isinstance(value, str) else value)
        return value

    @field_validator("stop_token_ids")
    @classmethod
    def _token_ids_are_non_negative(cls, value: list[int] | None) -> list[int] | None:
        if value and min(value) < 0:
            raise ValueError("token ids must be >= 0")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias_maps_token_ids_to_biases(
        cls, value: dict[str, float] | None
    ) -> dict[str, float] | None:
        for key, bias in (value or {}).items():
            if not (key.isascii() and key.isdigit()):
                raise ValueError(f"keys must be token ids, got {key[:20]!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"biases must be in [-100, 100], got {bias!r}")
        return value

    def logit_bias_pairs(self) -> tuple[tuple[int, float], ...]:
        """(token id, bias) pairs of logit_bias, in token id order."""
        return tuple(sorted((int(k), v) for k, v in (self.logit_bias or {}).items()))

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(
        cls, value: StreamOptions | None, info: ValidationInfo
    ) -> StreamOptions | None:
        if value is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed when stream is true")
        return value

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def num_choices(self) -> int:
        return self.n or 1

    def num_samples(self) -> int:
        """Samples to generate: n, or best_of on completions."""
        return self.num_choices()


class CompletionRequest(SamplingRequest):
    """POST /v1/completions. `prompt`: text or token ids (a batch of one is accepted)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1, le=MAX_CHOICES)

    @field_validator("prompt")
    @classmethod
    def _single_prompt(
        cls, value: str | list[int] | list[str] | list[list[int]]
    ) -> str | list[int] | list[str] | list[list[int]]:
        batch = isinstance(value, list) and value and isinstance(value[0], str | list)
        if batch and len(value) != 1:
            raise ValueError("batched prompts are not supported; send one per request")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("suffix is not supported")
        return value

    @field_validator("best_of")
    @classmethod
    def _best_of_covers_n(cls, value: int | None, info: ValidationInfo) -> int | None:
        n = info.data.get("n") or 1
        if value is not None and value < n:
            raise ValueError(f"best_of ({value}) must be at least n ({n})")
        if value is not None and value > n and info.data.get("stream"):
            raise ValueError("best_of > n cannot be streamed: the best samples are known last")
        return value

    def num_samples(self) -> int:
        return self.best_of or self.num_choices()

    def single_prompt(self) -> str | list[int]:
        """The one prompt: text or token ids."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            return prompt[0]  # type: ignore[return-value]
        return prompt  # type: ignore[return-value]


class TextPart(_Request):
    type: Literal["text"]
    text: str


FUNCTION_NAME = r"^[a-zA-Z0-9_-]{1,64}$"


class CalledFunction(_Request):
    name: str = Field(pattern=FUNCTION_NAME)
    arguments: str  # JSON text, as OpenAI sends it


class ToolCallIn(_Request):
    """A tool call of an earlier assistant message."""

    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # assistant messages
    tool_call_id: str | None = Field(default=None, min_length=1, max_length=256)  # tool messages
    reasoning_content: str | None = None  # an assistant's thinking (vLLM's name; also `reasoning`)
    reasoning: str | None = None

    @model_validator(mode="after")
    def _tool_fields_fit_the_role(self) -> ChatMessage:
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a message with role 'tool' needs tool_call_id")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return self

    def text(self) -> str:
        """The content as one string (text parts joined)."""
        content = self.content
        if isinstance(content, list):
            content = "\n".join(part.text for part in content)
        return content or ""

    def template_dict(self) -> dict[str, Any]:
        """The message as the chat template wants it (text parts joined)."""
        message: dict[str, Any] = {"role": self.role, "content": self.text()}
        for key in ("name", "reasoning_content", "reasoning"):
            if getattr(self, key) is not None:
                message[key] = getattr(self, key)
        return message


class JSONSchemaFormat(_Request):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _json_schema_goes_with_its_type(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs the json_schema object")
        return self


class FunctionDefinition(_Request):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Request):
    name: str = Field(pattern=FUNCTION_NAME)


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: FunctionName


class ChatCompletionRequest(SamplingRequest):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[ToolDefinition] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    # more chat template variables, e.g. {"enable_thinking": false} for Qwen3 (as vLLM takes)
    chat_template_kwargs: dict[str, Any] | None = Field(default=None, max_length=32)
    # vLLM's: the prompt ends inside the final (assistant) message, which the answer continues
    continue_final_message: bool = False

    @field_validator("continue_final_message")
    @classmethod
    def _continues_an_assistant_message(cls, value: bool, info: ValidationInfo) -> bool:
        messages = info.data.get("messages") or []
        if value and (not messages or messages[-1].role != "assistant"):
            raise ValueError("continue_final_message needs an assistant message last")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs requires logprobs=true")
        return value

    def requested_max_tokens(self) -> tuple[int | None, str]:
        """(max tokens asked for, the parameter that carried it)."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    def requested_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
