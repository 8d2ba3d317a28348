"""A reasoning model's thinking apart from its answer: `--reasoning-parser` (vLLM's names).

- `qwen3`: Qwen3 writes its thinking in `<think>...</think>` at the head of the output; an
  output without the opening tag is all answer (with `enable_thinking: false` its template
  closes the thinking in the prompt).
- `deepseek_r1`: DeepSeek-R1's template opens `<think>` in the prompt, so the output is
  thinking up to `</think>` (an opening tag the model repeats is dropped); an output that
  never closes it is all thinking.
- `gpt_oss`: gpt-oss's harmony format, read by router.api.harmony (the `analysis` channel is
  the thinking).

Either way a prompt whose last tag is an open `<think>` starts the output in thinking, and
one whose last tag is `</think>` starts it in the answer. Thinking is not parsed when the
request turns it off (`chat_template_kwargs` `enable_thinking` or `thinking` false) or when a
grammar constrains the output (structured outputs, a forced tool call). The split streams:
text that may still be the start of a tag, or whitespace before one, is held back until the
next text tells; whitespace at the head of each part and before `</think>` is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

THINK, END_THINK = "<think>", "</think>"
ReasoningParserName = Literal["qwen3", "deepseek_r1", "gpt_oss"]
REASONING_PARSERS: tuple[ReasoningParserName, ...] = ("qwen3", "deepseek_r1", "gpt_oss")
_THINKING_SWITCHES = ("enable_thinking", "thinking")


@dataclass(frozen=True)
class Split:
    """Text released by the splitter: thinking and answer."""

    reasoning: str = ""
    content: str = ""


class Splitter(Protocol):
    """Splits one output, fed in order, into thinking and answer."""

    reads_special_tokens: bool  # the text keeps the special tokens

    def feed(self, text: str) -> Split: ...

    def flush(self) -> Split:
        """The text held back, at the end of the output."""
        ...


def splitter_for(
    parser: str | None,
    prompt_text: str,
    template_kwargs: Mapping[str, Any] | None,
    constrained: bool,
) -> ReasoningSplitter | None:
    """The splitter of one request's output, or None when its thinking is not parsed."""
    kwargs = template_kwargs or {}
    if parser is None or constrained or any(kwargs.get(k) is False for k in _THINKING_SWITCHES):
        return None
    opened = prompt_text.rfind(THINK) > prompt_text.rfind(END_THINK)
    closed = prompt_text.rfind(END_THINK) > prompt_text.rfind(THINK)
    thinking = opened or (parser == "deepseek_r1" and not closed)
    return ReasoningSplitter(thinking)


class ReasoningSplitter:
    """Splits one output, fed in order, into thinking and answer.

    States: at the head (an opening tag may come), thinking (until `</think>`), answer.
    """

    reads_special_tokens = False

    def __init__(self, thinking: bool) -> None:
        self._thinking_by_default = thinking
        self._state: Literal["head", "thinking", "answer"] = "head"
        self._held = ""
        self._started: set[str] = set()  # the parts that released text already

    def feed(self, text: str) -> Split:
        self._held += text
        if self._state == "head":
            self._read_head()
        if self._state == "thinking":
            return self._read_thinking()
        if self._state == "answer":
            return Split(content=self._lead("answer", self._take(len(self._held))))
        return Split()

    def flush(self) -> Split:
        """The text held back, at the end of the output."""
        if self._state == "head":
            self._state = "thinking" if self._thinking_by_default else "answer"
        rest = self._take(len(self._held))
        if self._state == "thinking":
            return Split(reasoning=self._lead("thinking", rest.rstrip()))
        return Split(content=self._lead("answer", rest))

    def _read_head(self) -> None:
        head = self._held.lstrip()
        if head.startswith(THINK):
            self._held = head[len(THINK) :].lstrip()
            self._state = "thinking"
        elif not THINK.startswith(head):  # no opening tag comes (empty head: not yet known)
            self._held = head
            self._state = "thinking" if self._thinking_by_default else "answer"

    def _read_thinking(self) -> Split:
        end = self._held.find(END_THINK)
        if end >= 0:
            reasoning = self._lead("thinking", self._take(end).rstrip())
            self._held = self._held[len(END_THINK) :]
            self._state = "answer"
            return Split(reasoning, self._lead("answer", self._take(len(self._held))))
        return Split(reasoning=self._lead("thinking", self._take(_safe_end(self._held))))

    def _lead(self, part: str, text: str) -> str:
        """`text` of `part`, without the whitespace at the head of the part."""
        if part not in self._started:
            text = text.lstrip()
            if text:
                self._started.add(part)
        return text

    def _take(self, n: int) -> str:
        out, self._held = self._held[:n], self._held[n:]
        return out


def _safe_end(text: str) -> int:
    """How much of `text` is surely neither part of `</think>` nor whitespace before it."""
    cut = len(text)
    for k in range(min(len(END_THINK) - 1, len(text)), 0, -1):
        if text.endswith(END_THINK[:k]):
            cut = len(text) - k
            break
    while cut > 0 and text[cut - 1].isspace():
        cut -= 1
    return cut
