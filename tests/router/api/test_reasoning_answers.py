"""A reasoning model behind the router (`reasoning_parser`): its thinking comes back as
`reasoning_content`, apart from `content`, streamed and not, read with the official openai
client; `enable_thinking: false` reaches the chat template and turns the parsing off; a tool
call after the thinking still parses. Fake nodes generate the model's text; the tokenizer is
the default model's with a Qwen3-shaped (or DeepSeek-R1-shaped) chat template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
from router_fakes import FakeNode, fake_cluster
from thinking_model import DEEPSEEK_R1_TEMPLATE, QWEN3_TEMPLATE, script_of, thinking_tokenizer

from models.tokenizer import Tokenizer

pytestmark = pytest.mark.timeout(120)
QWEN3_OUT = "<think>\nParis is the capital.\n</think>\n\nThe capital of France is Paris."
THOUGHT, ANSWER = "Paris is the capital.", "The capital of France is Paris."
ASK = [{"role": "user", "content": "What is the capital of France?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
]


@pytest.fixture(scope="module")
def qwen3(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return thinking_tokenizer(default_model_dir, tmp_path_factory.mktemp("qwen3"), QWEN3_TEMPLATE)


@pytest.fixture(scope="module")
def r1(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path = tmp_path_factory.mktemp("r1")
    return thinking_tokenizer(default_model_dir, path, DEEPSEEK_R1_TEMPLATE)


def nodes(script: list[int]) -> list[FakeNode]:
    return [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]


async def answers(url: str, **extra: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(message, streamed message): content, reasoning_content and tool call names."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    body: dict[str, Any] = {"model": "smollm2", "messages": ASK, "max_tokens": 60} | extra
    whole = (await client.chat.completions.create(**body)).choices[0].message
    streamed: dict[str, Any] = {"content": "", "reasoning_content": "", "calls": []}
    async for chunk in await client.chat.completions.create(**body, stream=True):
        for choice in chunk.choices:
            streamed["content"] += choice.delta.content or ""
            streamed["reasoning_content"] += (choice.delta.model_extra or {}).get(
                "reasoning_content"
            ) or ""
            streamed["calls"] += [
                c.function.name
                for c in choice.delta.tool_calls or []
                if c.function and c.function.name
            ]
    got = {
        "content": whole.content or "",
        "reasoning_content": (whole.model_extra or {}).get("reasoning_content") or "",
        "calls": [c.function.name for c in whole.tool_calls or []],
    }
    return got, streamed


async def test_qwen3_thinking_comes_apart_from_the_answer(qwen3: Tokenizer) -> None:
    async with fake_cluster(
        qwen3, nodes(script_of(qwen3, QWEN3_OUT)), reasoning_parser="qwen3"
    ) as c:
        whole, streamed = await answers(c.router_url)
    want = {"content": ANSWER, "reasoning_content": THOUGHT, "calls": []}
    assert whole == streamed == want


async def test_without_a_parser_the_thinking_stays_in_the_answer(qwen3: Tokenizer) -> None:
    async with fake_cluster(qwen3, nodes(script_of(qwen3, QWEN3_OUT))) as c:
        whole, streamed = await answers(c.router_url)
    assert whole == streamed == {"content": QWEN3_OUT, "reasoning_content": "", "calls": []}


async def test_enable_thinking_false_reaches_the_template(qwen3: Tokenizer) -> None:
    script = script_of(qwen3, ANSWER)
    async with fake_cluster(qwen3, nodes(script), reasoning_parser="qwen3") as c:
        kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
        whole, streamed = await answers(c.router_url, extra_body=kwargs)
        prompt = qwen3.decode(c.nodes[0].prefills[0].prompt_token_ids, False)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert whole == streamed == {"content": ANSWER, "reasoning_content": "", "calls": []}


async def test_deepseek_r1_thinks_from_the_prompts_open_tag(r1: Tokenizer) -> None:
    script = script_of(r1, f"{THOUGHT}\n</think>\n\n{ANSWER}")
    async with fake_cluster(r1, nodes(script), reasoning_parser="deepseek_r1") as c:
        whole, streamed = await answers(c.router_url)
    assert whole == streamed == {"content": ANSWER, "reasoning_content": THOUGHT, "calls": []}


async def test_a_tool_call_after_the_thinking(qwen3: Tokenizer) -> None:
    script = script_of(qwen3, f"<think>\n{THOUGHT}\n</think>\n\n{CALL}")
    settings = {"reasoning_parser": "qwen3", "tool_call_parser": "hermes"}
    async with fake_cluster(qwen3, nodes(script), **settings) as c:
        whole, streamed = await answers(c.router_url, tools=TOOLS)
    want = {"content": "", "reasoning_content": THOUGHT, "calls": ["get_weather"]}
    assert whole == streamed == want
