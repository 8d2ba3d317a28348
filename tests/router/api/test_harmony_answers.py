"""A harmony model (gpt-oss's format) behind the router: the prompt is harmony, and with
`reasoning_parser: gpt_oss` its analysis channel comes back as `reasoning_content`, a message
to `functions.NAME` as `tool_calls`, the final channel as `content`, streamed and not; the
Responses API gives reasoning items and function calls, the Messages API thinking and
tool_use blocks. Fake nodes generate the text (the stop token `<|call|>` / `<|return|>`
included); the tokenizer is the default model's with the harmony tokens added."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from router_fakes import FakeNode, fake_cluster

from models.tokenizer import Tokenizer
from tests.router.harmony_model import harmony_tokenizer

pytestmark = pytest.mark.timeout(120)
THOUGHT = "User asks about the weather. Need get_weather."
ANALYSIS = f"<|channel|>analysis<|message|>{THOUGHT}<|end|>"
CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}<|call|>'
)
FINAL = "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris.<|return|>"
ASK = [{"role": "user", "content": "Weather in Paris?"}]
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}]


@pytest.fixture(scope="module")
def harmony(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return harmony_tokenizer(default_model_dir, tmp_path_factory.mktemp("harmony"))


def nodes(tokenizer: Tokenizer, text: str) -> list[FakeNode]:
    script = tokenizer.encode(text, add_special_tokens=False)
    return [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]


async def chat(url: str, **extra: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(message, streamed message): content, reasoning_content, calls and finish reason."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    body: dict[str, Any] = {"model": "smollm2", "messages": ASK, "max_tokens": 100} | extra
    whole = (await client.chat.completions.create(**body)).choices[0]
    streamed: dict[str, Any] = {"content": "", "reasoning": "", "calls": [], "finish": None}
    args: dict[int, str] = {}
    async for chunk in await client.chat.completions.create(**body, stream=True):
        for choice in chunk.choices:
            streamed["content"] += choice.delta.content or ""
            streamed["reasoning"] += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            for call in choice.delta.tool_calls or []:
                if call.function and call.function.name:
                    streamed["calls"].append([call.function.name])
                args[call.index] = args.get(call.index, "") + (call.function.arguments or "")
            streamed["finish"] = choice.finish_reason or streamed["finish"]
    for index, text in args.items():
        streamed["calls"][index].append(json.loads(text))
    got = {
        "content": whole.message.content or "",
        "reasoning": (whole.message.model_extra or {}).get("reasoning_content") or "",
        "calls": [
            [c.function.name, json.loads(c.function.arguments)]
            for c in whole.message.tool_calls or []
        ],
        "finish": whole.finish_reason,
    }
    return got, streamed


async def test_a_call_comes_back_as_tool_calls_and_reasoning(harmony: Tokenizer) -> None:
    async with fake_cluster(
        harmony, nodes(harmony, ANALYSIS + CALL), reasoning_parser="gpt_oss"
    ) as c:
        whole, streamed = await chat(c.router_url, tools=TOOLS)
        prompt = harmony.decode(c.nodes[0].prefills[0].prompt_token_ids, False)
    want = {
        "content": "",
        "reasoning": THOUGHT,
        "calls": [["get_weather", {"city": "Paris"}]],
        "finish": "tool_calls",
    }
    assert whole == streamed == want
    assert prompt.startswith("<|start|>system<|message|>")
    assert "type get_weather = (_: {\ncity: string,\n}) => any;" in prompt
    assert prompt.endswith("<|start|>user<|message|>Weather in Paris?<|end|><|start|>assistant")


async def test_the_final_channel_is_the_content(harmony: Tokenizer) -> None:
    async with fake_cluster(
        harmony, nodes(harmony, ANALYSIS + FINAL), reasoning_parser="gpt_oss"
    ) as c:
        whole, streamed = await chat(c.router_url)
    want = {"content": "It is sunny in Paris.", "reasoning": THOUGHT, "calls": [], "finish": "stop"}
    assert whole == streamed == want


async def test_without_the_reasoning_parser_the_analysis_stays_in_the_answer(
    harmony: Tokenizer,
) -> None:
    async with fake_cluster(harmony, nodes(harmony, ANALYSIS + FINAL)) as c:
        whole, streamed = await chat(c.router_url)
    content = f"{THOUGHT}\nIt is sunny in Paris."
    assert whole == streamed == {"content": content, "reasoning": "", "calls": [], "finish": "stop"}


async def test_responses_and_messages_get_reasoning_and_the_call(harmony: Tokenizer) -> None:
    async with fake_cluster(
        harmony, nodes(harmony, ANALYSIS + CALL), reasoning_parser="gpt_oss"
    ) as c:
        client = openai.AsyncOpenAI(base_url=c.router_url + "/v1", api_key="x", max_retries=0)
        tools = [{"type": "function", "name": "get_weather", "parameters": PARAMS}]
        response = await client.responses.create(
            model="smollm2",
            input="Weather in Paris?",
            tools=tools,
            store=False,  # type: ignore[arg-type]
        )
        claude = anthropic.AsyncAnthropic(base_url=c.router_url, api_key="x", max_retries=0)
        message = await claude.messages.create(
            model="smollm2", max_tokens=100, messages=ASK,  # type: ignore[arg-type]
            tools=[{"name": "get_weather", "input_schema": PARAMS}],
        )  # fmt: skip
    assert [item.type for item in response.output] == ["reasoning", "function_call"]
    assert response.output[0].content[0].text == THOUGHT  # type: ignore[union-attr,index]
    assert json.loads(response.output[1].arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    assert [block.type for block in message.content] == ["thinking", "tool_use"]
    assert message.content[1].input == {"city": "Paris"}  # type: ignore[union-attr]
