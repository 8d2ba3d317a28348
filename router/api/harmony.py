"""Reading a harmony output (gpt-oss's format) as it streams: channels into thinking,
answer and tool calls.

The output is text with the special tokens kept (the detokenizer keeps them for a harmony
model): messages `{header}<|message|>{body}` ending at `<|end|>`, `<|call|>` or
`<|return|>` (or the end of the output), each after the first opened by `<|start|>`. The
header names the channel (`<|channel|>analysis`) and maybe a recipient (`to=functions.NAME`,
in the role or the channel part) and a content type (`<|constrain|>json`). A body goes to:
- a tool call when its recipient is `functions.NAME` (any channel), and calls are read;
  dropped when the request offers no tools;
- the thinking when its channel is `analysis` and thinking is parsed (`--reasoning-parser
  gpt_oss`), else the answer;
- the answer otherwise (`final`, and `commentary` preambles).

Several messages of one part are joined by a newline. An output that does not open with a
header (`<|`) is all answer. A tool call goes on in the answer's text as
`OPENAI_OPEN{"name": NAME, "arguments": BODY}OPENAI_CLOSE`, which the `openai` tool call
parser (router.api.tool_parsers) reads, whole or streamed: no message body can hold either
marker, since each ends a body.
"""

from __future__ import annotations

import json
import re
from typing import Literal

from models.tokenizer import Tokenizer
from router.api.harmony_render import CALL, CHANNEL, CONSTRAIN, END, MESSAGE, RETURN, START
from router.api.reasoning import Split
from router.api.tool_parsers import OPENAI_CLOSE, OPENAI_OPEN

HARMONY_TOKENS = (START, END, MESSAGE, CHANNEL)
_BODY_ENDS = (END, CALL, RETURN, START)
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]*)")
Part = Literal["reasoning", "content", "call", "drop"]
State = Literal["head", "header", "body", "between", "plain"]


def uses_harmony(tokenizer: Tokenizer) -> bool:
    """A harmony model: its vocabulary holds `<|start|>`, `<|end|>`, `<|message|>` and
    `<|channel|>` as tokens (gpt-oss's tokenizer does)."""
    return all(tokenizer.token_id_of(t) is not None for t in HARMONY_TOKENS)


def reads_harmony(tokenizer: Tokenizer, reasoning_parser: str | None, tool_parser: str) -> bool:
    """Whether chat output is read as harmony: a harmony model, or a setting that names the
    format (`reasoning_parser` gpt_oss, `tool_call_parser` openai)."""
    named = reasoning_parser == "gpt_oss" or tool_parser == "openai"
    return named or uses_harmony(tokenizer)


class HarmonySplitter:
    """Splits one harmony output, fed in order, into thinking and answer (calls in the
    answer as markup). `reasoning`: analysis is thinking; `calls`: tools are offered."""

    reads_special_tokens = True

    def __init__(self, reasoning: bool, calls: bool) -> None:
        self._reasoning = reasoning
        self._calls = calls
        self._state: State = "head"
        self._held = ""
        self._part: Part = "drop"
        self._started: set[Part] = set()  # parts that released a message already
        self._args_seen = False  # the current call's body held more than whitespace

    def feed(self, text: str) -> Split:
        self._held += text
        out: list[tuple[Part, str]] = []
        while self._step(out):
            pass
        return _split(out)

    def flush(self) -> Split:
        """The end of the output: what is held, the last message closed."""
        out: list[tuple[Part, str]] = []
        if self._state in ("head", "plain"):
            out.append(("content", self._held))
        elif self._state == "body":
            out.append((self._part, self._held))
            self._close(out)
        self._held, self._state = "", "between"
        return _split(out)

    def _step(self, out: list[tuple[Part, str]]) -> bool:
        """Reads what the state can of the held text; True when the state changed."""
        if self._state == "head":
            return self._head()
        if self._state == "plain":
            out.append(("content", self._take(len(self._held))))
            return False
        if self._state == "between":
            return self._between()
        if self._state == "header":
            return self._header(out)
        return self._body(out)

    def _head(self) -> bool:
        lead = self._held.lstrip()
        if lead.startswith("<|"):
            self._held, self._state = lead, "header"
            return True
        if lead and not "<|".startswith(lead):
            self._state = "plain"
            return True
        return False

    def _between(self) -> bool:
        at = self._held.find(START)
        if at < 0:  # text outside messages is dropped; a partial marker is kept
            self._held = self._held[_safe_end(self._held, (START,)) :]
            return False
        self._held, self._state = self._held[at + len(START) :], "header"
        return True

    def _header(self, out: list[tuple[Part, str]]) -> bool:
        at = self._held.find(MESSAGE)
        if at < 0:
            return False
        header = self._take(at)
        self._held = self._held[len(MESSAGE) :]
        self._open(header, out)
        self._state = "body"
        return True

    def _body(self, out: list[tuple[Part, str]]) -> bool:
        ends = [(i, m) for m in _BODY_ENDS if (i := self._held.find(m)) >= 0]
        if not ends:
            out.append((self._part, self._take(_safe_end(self._held, _BODY_ENDS))))
            return False
        at, marker = min(ends)
        out.append((self._part, self._take(at)))
        self._held = self._held[len(marker) :]
        self._close(out)
        self._state = "header" if marker == START else "between"
        return True

    def _open(self, header: str, out: list[tuple[Part, str]]) -> None:
        """Routes the message whose header is `header`."""
        recipient = _RECIPIENT.search(header.split(CONSTRAIN)[0])
        channel = _CHANNEL.search(header)
        if recipient is not None and recipient.group(1).startswith("functions."):
            self._part = "call" if self._calls else "drop"
            name = recipient.group(1)[len("functions.") :]
            if self._calls:
                out.append(("content", f'{OPENAI_OPEN}{{"name": {json.dumps(name)}, "arguments": '))
            self._args_seen = False
            return
        thinking = channel is not None and channel.group(1) == "analysis"
        self._part = "reasoning" if thinking and self._reasoning else "content"
        if self._part in self._started:
            out.append((self._part, "\n"))
        self._started.add(self._part)

    def _close(self, out: list[tuple[Part, str]]) -> None:
        if self._part == "call":
            out.append(("content", ("" if self._args_seen else "{}") + "}" + OPENAI_CLOSE))
        self._part = "drop"

    def _take(self, n: int) -> str:
        taken, self._held = self._held[:n], self._held[n:]
        if self._part == "call" and taken.strip():
            self._args_seen = True
        return taken


def _split(pieces: list[tuple[Part, str]]) -> Split:
    reasoning = "".join(t for p, t in pieces if p == "reasoning")
    content = "".join(t for p, t in pieces if p in ("content", "call"))
    return Split(reasoning, content)


def _safe_end(text: str, markers: tuple[str, ...]) -> int:
    """How much of `text` surely starts none of `markers` (a marker's head may end it)."""
    for cut in range(max(0, len(text) - max(map(len, markers)) + 1), len(text)):
        if any(m.startswith(text[cut:]) for m in markers):
            return cut
    return len(text)
