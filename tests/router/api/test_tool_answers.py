"""Tool calls stream while they are generated, read with the official openai client: the
content first, then each call's name in a chunk of its own, then its arguments in pieces,
long before the last token; joined, they are the non-streamed answer's calls. A fake decode
node holds its tokens at a gate in the middle of a call's arguments."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionChunk
from router_fakes import FakeNode, fake_cluster

from models.tokenizer import Tokenizer

pytestmark = pytest.mark.timeout(120)
TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("get_weather", "get_time")
]
PARIS = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}'
BERLIN = '{"name": "get_time", "arguments": {"zone": "Europe/Berlin"}}'
DEADLINE_S = 20.0  # for what must come while the decode node waits at its gate


@dataclass
class Received:
    """A streamed choice as the client saw it, chunk by chunk."""

    content: str = ""
    names: dict[int, str] = field(default_factory=dict)
    arguments: dict[int, list[str]] = field(default_factory=dict)  # the deltas, per call
    finish: str | None = None
    content_after_a_call: bool = False

    def add(self, chunk: ChatCompletionChunk) -> None:
        for choice in chunk.choices:
            delta = choice.delta
            self.content += delta.content or ""
            self.content_after_a_call |= bool(delta.content) and bool(self.names)
            for call in delta.tool_calls or []:
                assert call.function is not None
                if call.function.name:
                    assert call.index not in self.names and call.function.arguments == ""
                    self.names[call.index] = call.function.name
                elif call.function.arguments:
                    self.arguments.setdefault(call.index, []).append(call.function.arguments)
            self.finish = choice.finish_reason or self.finish

    def calls(self) -> list[tuple[str, str]]:
        return [(self.names[i], "".join(self.arguments.get(i, []))) for i in sorted(self.names)]


@dataclass(frozen=True)
class Case:
    parser: str
    choice: Any
    text: str
    gate_in: str  # the decode node waits before the token that completes this text


CASES = {
    "hermes": Case(
        "hermes", "auto",
        f"Let me check.\n<tool_call>\n{PARIS}\n</tool_call>\n<tool_call>\n{BERLIN}\n</tool_call>",
        '"Europe/Ber'),
    "json": Case(
        "json", "auto", f"Sure. <tool_call>{PARIS}</tool_call><tool_call>{BERLIN}", '"Europe/Ber'),
    "mistral": Case("mistral", "auto", f"On it. [TOOL_CALLS] [{PARIS}, {BERLIN}]", '"Europe/Ber'),
    "required": Case(
        "auto", "required", '{"name":"get_weather","arguments":{"city":"Paris","unit":"C"}}',
        '"unit'),
    "named": Case(
        "auto", {"type": "function", "function": {"name": "get_time"}},
        '{"name":"get_time","arguments":{"zone":"Europe/Berlin"}}', "Europe/Ber"),
}  # fmt: skip


def gated_script(tokenizer: Tokenizer, case: Case) -> tuple[list[int], int]:
    """The case's tokens and EOS, and the index of the first token that completes
    `gate_in`."""
    ids = tokenizer.encode(case.text, add_special_tokens=False) + [min(tokenizer.eos_token_ids)]
    at = next(k for k in range(len(ids)) if case.gate_in in tokenizer.decode(ids[: k + 1]))
    return ids, at


def request(case: Case) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Weather in Paris and time in Berlin?"}]
    return {"model": "smollm2", "messages": messages, "max_tokens": 120, "tools": TOOLS,
            "tool_choice": case.choice}  # fmt: skip


async def read_until(
    chunks: AsyncIterator[ChatCompletionChunk], seen: Received, ready: Callable[[], bool]
) -> None:
    while not ready():
        seen.add(await anext(chunks))


@pytest.mark.parametrize("name", sorted(CASES))
async def test_calls_stream_before_the_last_token_and_join_to_the_answer(
    tokenizer: Tokenizer, name: str
) -> None:
    case = CASES[name]
    script, at = gated_script(tokenizer, case)
    gate = asyncio.Event()  # open for the non-streamed answer, shut for the stream
    gate.set()
    nodes = [FakeNode("p0", "prefill", script),
             FakeNode("d0", "decode", script, gate=gate, gate_at=at)]  # fmt: skip
    settings = {"tool_call_parser": case.parser, "decode_idle_timeout_s": 2 * DEADLINE_S}
    async with fake_cluster(tokenizer, nodes, **settings) as c:
        client = openai.AsyncOpenAI(base_url=c.router_url + "/v1", api_key="x", max_retries=0)
        whole = await _answer_of(client, case)
        last = len(whole) - 1  # the call the gate is in
        seen = Received()
        gate.clear()
        chunks = aiter(await client.chat.completions.create(**request(case), stream=True))

        def ready() -> bool:  # every call named, the last one's arguments begun in pieces
            return len(seen.names) == len(whole) and len(seen.arguments.get(last, [])) >= 2

        await asyncio.wait_for(read_until(chunks, seen, ready), DEADLINE_S)
        assert not gate.is_set() and seen.finish is None  # all this before the gated token
        early = "".join(seen.arguments[last])
        assert whole[last][1].startswith(early) and early != whole[last][1]
        gate.set()
        async for chunk in chunks:
            seen.add(chunk)
    assert seen.calls() == whole and seen.finish == "tool_calls"
    assert not seen.content_after_a_call  # the calls' markup never shows as content
    expected_content = case.text.split("<tool_call>")[0].split("[TOOL_CALLS]")[0].strip()
    assert seen.content == (expected_content if case.choice == "auto" else "")


async def _answer_of(client: openai.AsyncOpenAI, case: Case) -> list[Any]:
    """The non-streamed answer's calls, (name, arguments) each."""
    reply = await client.chat.completions.create(**request(case))
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert all(json.loads(c.function.arguments) for c in calls)
    return [(c.function.name, c.function.arguments) for c in calls]


async def test_a_streamed_call_cut_by_max_tokens_says_length(tokenizer: Tokenizer) -> None:
    """Its name and the arguments so far went out; the finish reason says it is no whole
    call (the non-streamed answer gives the text as content, as before)."""
    case = CASES["required"]
    script, at = gated_script(tokenizer, case)
    nodes = [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]
    body = request(case) | {"max_tokens": at}
    async with fake_cluster(tokenizer, nodes) as c:
        client = openai.AsyncOpenAI(base_url=c.router_url + "/v1", api_key="x", max_retries=0)
        seen = Received()
        async for chunk in await client.chat.completions.create(**body, stream=True):
            seen.add(chunk)
        reply = await client.chat.completions.create(**body)
    assert seen.finish == "length" and seen.names == {0: "get_weather"}
    assert seen.calls()[0][1] == '{"city": "Paris", '
    assert reply.choices[0].finish_reason == "length" and not reply.choices[0].message.tool_calls
    assert reply.choices[0].message.content == tokenizer.decode(script[:at])


async def test_each_tokens_logprob_goes_out_once(tokenizer: Tokenizer) -> None:
    """Tokens held back while it is unknown whether they are a call send their logprobs with
    the next chunk that goes out."""
    case = CASES["hermes"]
    script, _ = gated_script(tokenizer, case)
    nodes = [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]
    body = request(case) | {"logprobs": True, "stream_options": {"include_usage": True}}
    async with fake_cluster(tokenizer, nodes, tool_call_parser="hermes") as c:
        client = openai.AsyncOpenAI(base_url=c.router_url + "/v1", api_key="x", max_retries=0)
        seen, sent, usage = Received(), 0, None
        async for chunk in await client.chat.completions.create(**body, stream=True):
            seen.add(chunk)
            sent += sum(len(ch.logprobs.content or []) for ch in chunk.choices if ch.logprobs)
            usage = chunk.usage or usage
    assert seen.finish == "tool_calls" and len(seen.names) == 2
    assert usage is not None and sent == usage.completion_tokens == len(script)
