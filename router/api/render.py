"""Text deltas -> OpenAI response objects, for chat and for plain completions."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from pydantic import BaseModel

from cluster.protocol import TokenLogprobMsg
from models.tokenizer import Tokenizer
from router.api.objects import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatLogprobs,
    ChatResponseMessage,
    ChatTokenLogprob,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    PromptTokensDetails,
    TopLogprob,
    Usage,
)
from router.api.text_deltas import TextDelta


def make_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    )


class Formatter(Protocol):
    """Builds one endpoint's stream chunks and final response."""

    def chunk(
        self, delta: TextDelta, first: bool, index: int = 0
    ) -> BaseModel | Sequence[BaseModel] | None:
        """The SSE chunk (or chunks) for a delta of choice `index`; None when there is
        nothing to send."""
        ...

    def usage_chunk(self, usage: Usage) -> BaseModel: ...

    def response(self, deltas: Sequence[TextDelta], usage: Usage) -> BaseModel: ...

    def responses(self, choices: Sequence[Sequence[TextDelta]], usage: Usage) -> BaseModel:
        """One response holding several choices, indexed in order."""
        ...


def reasoning_of(deltas: Sequence[TextDelta]) -> str | None:
    """The thinking of a whole output (None without any)."""
    return "".join(d.reasoning for d in deltas) or None


def chunks_of(piece: BaseModel | Sequence[BaseModel] | None) -> Sequence[BaseModel]:
    """What `Formatter.chunk` returned, as a list of chunks to send."""
    if piece is None:
        return []
    return [piece] if isinstance(piece, BaseModel) else piece


class _Base:
    def __init__(
        self, request_id: str, model: str, tokenizer: Tokenizer, top_n: int | None
    ) -> None:
        self.request_id = request_id
        self.model = model
        self.created = int(time.time())
        self._tokenizer = tokenizer
        self._top_n = top_n  # None = no logprobs

    def _wants(self, delta: TextDelta) -> bool:
        return self._top_n is not None and bool(delta.logprobs)

    def _top(self, lp: TokenLogprobMsg) -> list[tuple[str, float]]:
        n = self._top_n or 0
        return [(self._tokenizer.token_to_str(t), v) for t, v in lp.top[:n]]


class ChatFormatter(_Base):
    """chat.completion and chat.completion.chunk objects."""

    def chunk(self, delta: TextDelta, first: bool, index: int = 0) -> ChatCompletionChunk | None:
        content: dict[str, str] = {"role": "assistant"} if first else {}
        if delta.text or first:
            content["content"] = delta.text
        if delta.reasoning:
            content["reasoning_content"] = delta.reasoning
        logprobs = self._logprobs([delta])
        if not content and logprobs is None and delta.finish_reason is None:
            return None
        choice = ChatChunkChoice(
            index=index, delta=content, logprobs=logprobs, finish_reason=delta.finish_reason
        )
        return ChatCompletionChunk(
            id=self.request_id, created=self.created, model=self.model, choices=[choice]
        )

    def usage_chunk(self, usage: Usage) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.request_id, created=self.created, model=self.model, choices=[], usage=usage
        )

    def response(self, deltas: Sequence[TextDelta], usage: Usage) -> ChatCompletion:
        return self.responses([deltas], usage)

    def responses(self, choices: Sequence[Sequence[TextDelta]], usage: Usage) -> ChatCompletion:
        return ChatCompletion(
            id=self.request_id, created=self.created, model=self.model, usage=usage,
            choices=[self._choice(deltas, i) for i, deltas in enumerate(choices)],
        )  # fmt: skip

    def _choice(self, deltas: Sequence[TextDelta], index: int) -> ChatChoice:
        return ChatChoice(
            index=index,
            message=ChatResponseMessage(
                content="".join(d.text for d in deltas), reasoning_content=reasoning_of(deltas)
            ),
            logprobs=self._logprobs(deltas),
            finish_reason=deltas[-1].finish_reason if deltas else None,
        )

    def _logprobs(self, deltas: Sequence[TextDelta]) -> ChatLogprobs | None:
        entries = [self._entry(lp) for d in deltas if self._wants(d) for lp in d.logprobs or []]
        return ChatLogprobs(content=entries) if entries else None

    def _entry(self, lp: TokenLogprobMsg) -> ChatTokenLogprob:
        token = self._tokenizer.token_to_str(lp.token_id)
        top = [TopLogprob(token=t, logprob=v, bytes=list(t.encode())) for t, v in self._top(lp)]
        return ChatTokenLogprob(
            token=token, logprob=lp.logprob, bytes=list(token.encode()), top_logprobs=top
        )


class CompletionFormatter(_Base):
    """text_completion objects (the same shape streamed and not).

    With `echo` (the prompt's text and token ids), each choice starts with the prompt: its
    first chunk, or the head of its text. Prompt tokens carry null logprobs.
    """

    def __init__(
        self,
        request_id: str,
        model: str,
        tokenizer: Tokenizer,
        top_n: int | None,
        echo: tuple[str, list[int]] | None = None,
    ) -> None:
        super().__init__(request_id, model, tokenizer, top_n)
        self._echo = echo
        self._echo_head = TextDelta(echo[0], echo[1], None, None, 0) if echo else None

    def chunk(self, delta: TextDelta, first: bool, index: int = 0) -> Completion | None:
        deltas = [delta]
        if first and self._echo_head is not None:
            deltas = [self._echo_head, delta]
        logprobs = self._logprobs(deltas)
        text = "".join(d.text for d in deltas)
        if not text and logprobs is None and delta.finish_reason is None:
            return None
        choice = CompletionChoice(
            index=index, text=text, logprobs=logprobs, finish_reason=delta.finish_reason
        )
        return Completion(
            id=self.request_id, created=self.created, model=self.model, choices=[choice]
        )

    def usage_chunk(self, usage: Usage) -> Completion:
        return Completion(
            id=self.request_id, created=self.created, model=self.model, choices=[], usage=usage
        )

    def response(self, deltas: Sequence[TextDelta], usage: Usage) -> Completion:
        return self.responses([deltas], usage)

    def responses(self, choices: Sequence[Sequence[TextDelta]], usage: Usage) -> Completion:
        return Completion(
            id=self.request_id, created=self.created, model=self.model, usage=usage,
            choices=[self._choice(deltas, i) for i, deltas in enumerate(choices)],
        )  # fmt: skip

    def _choice(self, deltas: Sequence[TextDelta], index: int) -> CompletionChoice:
        head = [self._echo_head] if self._echo_head is not None else []
        return CompletionChoice(
            index=index,
            text="".join(d.text for d in [*head, *deltas]),
            logprobs=self._logprobs([*head, *deltas]),
            finish_reason=deltas[-1].finish_reason if deltas else None,
        )

    def _logprobs(self, deltas: Sequence[TextDelta]) -> CompletionLogprobs | None:
        out = CompletionLogprobs()
        shift = len(self._echo[0]) if self._echo is not None else 0
        for delta in deltas:
            if delta is self._echo_head and self._top_n is not None:
                self._echo_logprobs(out, delta)
                continue
            if not self._wants(delta):
                continue
            for lp in delta.logprobs or []:
                out.tokens.append(self._tokenizer.token_to_str(lp.token_id))
                out.token_logprobs.append(lp.logprob)
                out.top_logprobs.append(dict(self._top(lp)))
                out.text_offset.append(delta.text_offset + shift)
        return out if out.tokens else None

    def _echo_logprobs(self, out: CompletionLogprobs, delta: TextDelta) -> None:
        offset = 0
        for token_id in delta.token_ids:
            token = self._tokenizer.token_to_str(token_id)
            out.tokens.append(token)
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            out.text_offset.append(offset)
            offset += len(self._tokenizer.decode([token_id]))
