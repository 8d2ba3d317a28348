"""Tool calls in the formats of the model families: Qwen's `<tool_call>` tags (hermes),
Mistral's `[TOOL_CALLS]` array, splitserve's own (json); the parser follows the chat template
unless the router's tool_call_parser setting names one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from router_fakes import FakeNode, fake_cluster
from test_tool_calls import stopped_content

from config_kit import SettingsError, load
from models.tokenizer import Tokenizer
from router.api.tool_parsers import PARSERS, ParsedCall, ParsedOutput, parser_for
from router.settings import RouterSettings

pytestmark = pytest.mark.timeout(120)
NAMES = frozenset({"get_weather", "get_time"})
PARIS = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
NOON = '{"name": "get_time", "arguments": {}}'
PARIS_CALL = ParsedCall("get_weather", '{"city": "Paris"}')
NOON_CALL = ParsedCall("get_time", "{}")
# A template that writes Qwen's call format and renders tools itself (as Qwen's do)
QWEN_LIKE = (
    "{%- if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}"
    '</tools> Answer a call as <tool_call>{"name": ..., "arguments": ...}</tool_call>'
    "<|im_end|>\n{% endif %}"
    "{%- for m in messages %}{% if m.role == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if boom is defined %}{{ 'x' + boom }}{% endif %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("parser", "text", "expected"),
    [
        ("hermes", f"<tool_call>\n{PARIS}\n</tool_call>", ParsedOutput(None, [PARIS_CALL])),
        ("hermes", f"Let me look.\n<tool_call>\n{PARIS}\n</tool_call>\n<tool_call>\n{NOON}\n"
         "</tool_call>", ParsedOutput("Let me look.", [PARIS_CALL, NOON_CALL])),
        ("hermes", f"<tool_call>\n{PARIS}", ParsedOutput(None, [PARIS_CALL])),  # left open
        ("hermes", "<think>\nhm\n</think>\n\n<tool_call>\n"
         '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n</tool_call>',
         ParsedOutput("<think>\nhm\n</think>", [PARIS_CALL])),
        ("hermes", PARIS, None),  # hermes wants the tags
        ("json", PARIS, ParsedOutput(None, [PARIS_CALL])),
        ("json", f"Sure: <tool_call>{PARIS}</tool_call>", ParsedOutput("Sure:", [PARIS_CALL])),
        ("mistral", f"[TOOL_CALLS][{PARIS}, {NOON}]", ParsedOutput(None, [PARIS_CALL, NOON_CALL])),
        ("mistral", f" [{PARIS}]", ParsedOutput(None, [PARIS_CALL])),  # the marker skipped
        ("mistral", f"Checking. [TOOL_CALLS] [{PARIS}]", ParsedOutput("Checking.", [PARIS_CALL])),
    ],
)  # fmt: skip
def test_calls_are_read_in_each_format(
    parser: str, text: str, expected: ParsedOutput | None
) -> None:
    assert PARSERS[parser].parse(text, NAMES) == expected


@pytest.mark.parametrize("parser", sorted(PARSERS))
@pytest.mark.parametrize(
    "text",
    [
        "It is sunny.",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>',  # malformed
        '<tool_call>{"name": "launch", "arguments": {}}</tool_call>',  # unknown function
        '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>',  # not an object
        f"<tool_call>{PARIS}</tool_call><tool_call>{{oops</tool_call>",  # one of two broken
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}',  # cut JSON
        "[TOOL_CALLS][]",
        "",
        '<tool_call>{"name": ["get_weather"], "arguments": {}}</tool_call>',  # a name that is
        '{"name": {"get_weather": 1}}',  # no string (these were a 500)
        '[TOOL_CALLS][{"name": "get_time", "arguments": {"a": ' + "[" * 10**5 + "]" * 10**5 + "}}]",
    ],
    ids=lambda text: text[:40],
)
def test_what_does_not_parse_is_no_call(parser: str, text: str) -> None:
    assert PARSERS[parser].parse(text, NAMES) is None


def test_the_template_picks_the_parser_unless_the_setting_names_one() -> None:
    assert parser_for("auto", QWEN_LIKE).name == "hermes"
    assert parser_for("auto", "{{ '[TOOL_CALLS]' }}").name == "mistral"
    assert parser_for("auto", "{% for m in messages %}{{ m.content }}{% endfor %}").name == "json"
    assert parser_for("auto", None).name == "json"
    assert parser_for("json", QWEN_LIKE).name == "json"
    with pytest.raises(ValueError, match="unknown tool call parser 'pythonic'"):
        parser_for("pythonic", None)
    with pytest.raises(SettingsError, match="tool_call_parser"):
        load(RouterSettings, tool_call_parser="pythonic")


def test_mistral_call_ids_are_what_mistral_templates_accept() -> None:
    ids = {PARSERS["mistral"].new_call_id() for _ in range(50)}
    assert len(ids) == 50 and all(len(i) == 9 and i.isalnum() for i in ids)


# ---------------------------------------------------------------- through the router


@pytest.fixture
def qwen_like(default_model_dir: Path, tmp_path: Path) -> Tokenizer:
    (tmp_path / "tokenizer.json").write_bytes((default_model_dir / "tokenizer.json").read_bytes())
    config = json.loads((default_model_dir / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(config | {"chat_template": QWEN_LIKE})
    )
    return Tokenizer.from_dir(tmp_path)


async def _serve(
    tokenizer: Tokenizer, text: str, body: dict[str, Any], **settings: Any
) -> tuple[httpx.Response, FakeNode]:
    script = tokenizer.encode(text, add_special_tokens=False) + [min(tokenizer.eos_token_ids)]
    nodes = [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]
    async with (
        fake_cluster(tokenizer, nodes, **settings) as c,
        httpx.AsyncClient(timeout=60) as client,
    ):
        resp = await client.post(c.router_url + "/v1/chat/completions", json=body)
    return resp, nodes[0]


def _chat(**extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Weather and time in Paris?"}]
    return {"model": "smollm2", "messages": messages, "max_tokens": 80} | extra


def _chunks(resp: httpx.Response) -> list[dict[str, Any]]:
    lines = [x[len("data: ") :] for x in resp.text.splitlines() if x.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(x) for x in lines[:-1]]
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
    return chunks


QWEN_OUTPUT = (
    f"Let me check.\n<tool_call>\n{PARIS}\n</tool_call>\n<tool_call>\n{NOON}\n</tool_call>"
)


async def test_qwen_calls_become_tool_calls_with_the_text_before_as_content(
    qwen_like: Tokenizer,
) -> None:
    resp, prefill = await _serve(qwen_like, QWEN_OUTPUT, _chat(tools=[WEATHER, TIME]))
    assert resp.status_code == 200, resp.text
    (choice,) = ChatCompletion.model_validate(resp.json()).choices
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
    calls = choice.message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {}),
    ]
    assert len({c.id for c in calls}) == 2
    prompt = qwen_like.decode(prefill.prefills[0].prompt_token_ids, skip_special_tokens=False)
    assert '<tools>{"type": "function", "function": {"name": "get_weather"' in prompt


async def test_qwen_calls_stream_as_content_then_each_call(qwen_like: Tokenizer) -> None:
    resp, _ = await _serve(qwen_like, QWEN_OUTPUT, _chat(tools=[WEATHER, TIME], stream=True))
    assert resp.status_code == 200, resp.text
    chunks = _chunks(resp)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0]["role"] == "assistant"
    first_call = next(i for i, d in enumerate(deltas) if "tool_calls" in d)
    assert "".join(d.get("content") or "" for d in deltas[:first_call]) == "Let me check."
    assert not any(d.get("content") for d in deltas[first_call:])  # no markup as content
    calls = [t for d in deltas for t in d.get("tool_calls", [])]
    heads = [(t["index"], t["function"]["name"]) for t in calls if "id" in t]
    assert heads == [(0, "get_weather"), (1, "get_time")]
    arguments: dict[int, str] = {}
    for t in calls:
        arguments[t["index"]] = arguments.get(t["index"], "") + t["function"]["arguments"]
    assert {i: json.loads(a) for i, a in arguments.items()} == {0: {"city": "Paris"}, 1: {}}
    reasons = [c["choices"][0]["finish_reason"] for c in chunks]
    assert reasons == [None] * (len(chunks) - 1) + ["tool_calls"]


MALFORMED = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\n</tool_call>'


async def test_a_malformed_qwen_call_stays_content(qwen_like: Tokenizer) -> None:
    resp, _ = await _serve(qwen_like, MALFORMED, _chat(tools=[WEATHER]))
    assert stopped_content(resp, stream=False) == MALFORMED


async def test_a_streamed_call_that_breaks_off_never_says_tool_calls(qwen_like: Tokenizer) -> None:
    """Streamed, the call went out from its name on, up to where its JSON broke; the stream
    ends with the generation's finish reason, and the markup never shows as content."""
    resp, _ = await _serve(qwen_like, MALFORMED, _chat(tools=[WEATHER], stream=True))
    assert resp.status_code == 200, resp.text
    deltas = [c["choices"][0]["delta"] for c in _chunks(resp)]
    calls = [t for d in deltas for t in d.get("tool_calls", [])]
    assert [t["function"]["name"] for t in calls if "id" in t] == ["get_weather"]
    assert "".join(t["function"]["arguments"] for t in calls) == '{"city": "Par'
    assert not any(d.get("content") for d in deltas)
    assert _chunks(resp)[-1]["choices"][0]["finish_reason"] == "stop"


async def test_the_setting_overrides_the_templates_parser(qwen_like: Tokenizer) -> None:
    body = _chat(tools=[WEATHER])
    resp, _ = await _serve(qwen_like, PARIS, body)  # hermes: a bare object is text
    assert resp.json()["choices"][0]["message"]["content"] == PARIS
    resp, _ = await _serve(qwen_like, PARIS, body, tool_call_parser="json")
    assert resp.json()["choices"][0]["finish_reason"] == "tool_calls"


async def test_chat_template_kwargs_reach_the_template(qwen_like: Tokenizer) -> None:
    body = _chat(chat_template_kwargs={"enable_thinking": False})
    resp, prefill = await _serve(qwen_like, "Sunny.", body)
    assert resp.status_code == 200, resp.text
    prompt = qwen_like.decode(prefill.prefills[0].prompt_token_ids, skip_special_tokens=False)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]},
         "messages", "System role not supported"),
        ({"chat_template_kwargs": {"boom": 1}}, "messages", "chat template rejected"),
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages",
         "may not set 'messages'"),
        ({"chat_template_kwargs": {"add_generation_prompt": False}},
         "chat_template_kwargs.add_generation_prompt", "may not set"),
        ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs", "an object"),
    ],
)  # fmt: skip
async def test_what_the_template_refuses_is_a_400_naming_it(
    qwen_like: Tokenizer, extra: dict[str, Any], param: str, says: str
) -> None:
    resp, prefill = await _serve(qwen_like, "Sunny.", _chat(**extra))
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and says in error["message"]
    assert error["type"] == "invalid_request_error"
    assert not prefill.prefills
