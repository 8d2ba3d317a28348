"""A real model that answers in harmony (gpt-oss's format) through `splitserve up`, 1 prefill
+ 1 decode over TCP, with `reasoning_parser: gpt_oss`: its analysis message comes back as
`reasoning_content` and its call to `functions.get_weather` as `tool_calls`, streamed and
not. The model is a scripted bigram machine (tests/e2e/scripted_model.py) on the default
model's vocabulary with the harmony tokens added: greedy, it says the chain below after the
prompt's `<|start|>assistant`, whatever the conversation; the router renders the prompt and
keeps the special tokens when it reads the output. A bigram machine says a token twice only
with one successor, so the second `<|channel|>` and `<|message|>` are spelled with plain
pieces added to the vocabulary ("<|chan" "nel|>"), which decode to the same text."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cluster_harness import running_cluster
from scripted_model import save_scripted_model, spell_unused
from session_procs import session_processes

from models.tokenizer import Tokenizer
from tests.router.harmony_model import harmony_tokenizer_dir

pytestmark = pytest.mark.e2e
THOUGHT = "User wants the forecast for Paris, so call the tool"
SAID = (
    f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>commentary "
    'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
)
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}]
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def harmony_chain(tokenizer: Tokenizer) -> list[int]:
    """The prompt's last token, then SAID's tokens, a repeated one spelled with others."""
    chain = tokenizer.encode("<|start|>assistant", add_special_tokens=False)[-1:]
    for token in tokenizer.encode(SAID, add_special_tokens=False):
        if token in chain:
            chain += spell_unused(tokenizer, tokenizer.decode([token], False), chain)
        else:
            chain.append(token)
    return chain


@pytest.fixture(scope="module")
def model_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer_dir = harmony_tokenizer_dir(
        default_model_dir, tmp_path_factory.mktemp("tok"), ["<|chan", "nel|>", "<|mess", "age|>"]
    )
    tokenizer = Tokenizer.from_dir(tokenizer_dir)
    chain = harmony_chain(tokenizer)
    assert tokenizer.decode(chain[1:], False) == SAID
    stops = [tokenizer.token_id_of("<|call|>"), tokenizer.token_id_of("<|return|>")]
    path = tmp_path_factory.mktemp("harmony-model")
    save_scripted_model(path, chain, tokenizer.vocab_size, [t for t in stops if t is not None])
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, path / name)
    return path


def test_a_harmony_call_parses_into_tool_calls_and_reasoning(
    model_dir: Path, tmp_path: Path
) -> None:
    args = ["--prefill", "1", "--decode", "1", "--num-kv-blocks", "64", "--transfer", "tcp"]
    env = {"SPLITSERVE_REASONING_PARSER": "gpt_oss"}
    with running_cluster(model_dir, tmp_path / "run", *args, env=env, check_clean_exit=True) as up:
        client = up.openai_client()
        model = client.models.list().data[0].id
        whole = client.chat.completions.create(
            model=model,
            messages=ASK,
            tools=TOOLS,
            max_tokens=64,
            temperature=0,
        ).choices[0]
        chunks = list(
            client.chat.completions.create(
                model=model,
                messages=ASK,
                tools=TOOLS,
                max_tokens=64,
                temperature=0,
                stream=True,
            )
        )
        counters = up.stats(up.node_names("decode")[0]).counters
    calls = [
        (c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls or []
    ]
    assert (whole.message.model_extra or {}).get("reasoning_content") == THOUGHT
    assert calls == [("get_weather", {"city": "Paris"})]
    assert whole.finish_reason == "tool_calls"
    reasoning, names, arguments = "", [], ""
    for chunk in chunks:
        for choice in chunk.choices:
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            for call in choice.delta.tool_calls or []:
                names += [call.function.name] if call.function and call.function.name else []
                arguments += (call.function.arguments or "") if call.function else ""
    assert (reasoning, names, json.loads(arguments)) == (THOUGHT, [calls[0][0]], calls[0][1])
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert counters["transfer_ok"] == 2  # both prompts went through the prefill node
    assert session_processes(up.proc.pid) == []
