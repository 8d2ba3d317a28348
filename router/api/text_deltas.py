"""Turns streamed token ids into text deltas: incremental detokenization + stop strings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cluster.protocol import TokenLogprobMsg
from models import IncrementalDetokenizer, Tokenizer
from router.api.reasoning import Split, Splitter
from router.api.stop_strings import StopMatcher


@dataclass(frozen=True)
class TokenChunk:
    """New tokens of one request, as the flow receives them from a node."""

    token_ids: list[int]
    logprobs: list[TokenLogprobMsg] | None = None
    finish_reason: str | None = None  # set on the last chunk


@dataclass(frozen=True)
class TextDelta:
    """Text that became safe to show, the tokens consumed for it, and whether it is the end.

    `text_offset` is where this delta's text starts in the whole completion. With a
    reasoning parser, `text` is the answer and `reasoning` the thinking.
    """

    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprobMsg] | None
    finish_reason: str | None
    text_offset: int
    reasoning: str = ""


class OutputProcessor:
    """Per-request text state. Feed chunks in order; a delta with finish_reason is the last.

    A stop string ends the output with finish_reason "stop"; the caller then stops the node.
    `reasoning` splits the text into thinking and answer (the special tokens kept when it
    reads them).
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int],
        stops: Sequence[str],
        reasoning: Splitter | None = None,
    ) -> None:
        keep = reasoning is not None and reasoning.reads_special_tokens
        self._detok = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens=not keep)
        self._stops = StopMatcher(stops)
        self._reasoning = reasoning
        self.num_tokens = 0
        self.text_len = 0
        self.finish_reason: str | None = None

    def feed(self, chunk: TokenChunk) -> TextDelta:
        """Consume one chunk; returns the text it releases (possibly empty)."""
        if self.finish_reason is not None:
            raise RuntimeError("OutputProcessor.feed() after the final chunk")
        self.num_tokens += len(chunk.token_ids)
        raw = "".join(self._detok.add(t) for t in chunk.token_ids)
        if chunk.finish_reason is not None:
            raw += self._detok.flush()
        text, stopped = self._stops.feed(raw)
        finish = "stop" if stopped else chunk.finish_reason
        if finish is not None and not stopped:
            text += self._stops.flush()
        split = self._split(text, finish is not None)
        delta = TextDelta(
            split.content, chunk.token_ids, chunk.logprobs, finish, self.text_len, split.reasoning
        )
        self.text_len += len(split.content)
        self.finish_reason = finish
        return delta

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the output, if one did."""
        return self._stops.matched

    def _split(self, text: str, last: bool) -> Split:
        if self._reasoning is None:
            return Split(content=text)
        split = self._reasoning.feed(text)
        if not last:
            return split
        rest = self._reasoning.flush()
        return Split(split.reasoning + rest.reasoning, split.content + rest.content)
