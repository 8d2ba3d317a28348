"""The chat templates of the deployed families (Qwen2.5, Qwen3 and Qwen3-MoE, Gemma 2 and 3,
Phi-3, Mistral, Mixtral) render as transformers' apply_chat_template renders the same
template and messages; what a template refuses is a ValueError carrying its own message.

The templates are the vendors' own, fetched once and cached (tests/models/family_templates.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from family_templates import FAMILIES, template_of
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import models as token_models
from tokenizers import pre_tokenizers

from models.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.timeout(600)  # the first run downloads the templates

WEATHER = {  # nested, non-ASCII: what the templates' tojson writes
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Le temps qu'il fait à une ville",
        "parameters": {
            "type": "object",
            "properties": {
                "place": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "lat": {"type": "number"}},
                },
                "days": {"type": "integer", "minimum": 1},
            },
            "required": ["place"],
        },
    },
}
USER = {"role": "user", "content": "Weather in Paris, é 🙂?"}
ANSWER = {"role": "assistant", "content": "Sunny, 21 °C."}
SYSTEM = {"role": "system", "content": "You are terse."}
CALL_ID = "a1B2c3D4e"  # Mistral's templates want 9 alphanumerics


def _call(arguments: Any) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": CALL_ID,
                "type": "function",
                "function": {"name": "get_weather", "arguments": arguments},
            }
        ],
    }


TOOL_RESULT = {"role": "tool", "tool_call_id": CALL_ID, "content": '{"sky": "sunny"}'}
PLAIN_CHATS = {
    "one turn": [USER],
    "three turns": [USER, ANSWER, {"role": "user", "content": "And tomorrow?"}],
}
TOOL_CHAT = [USER, _call({"city": "Paris"}), TOOL_RESULT]
# (family, chat, tools, template variables): each family's own features
FEATURES: list[tuple[str, list[dict[str, Any]], bool, dict[str, Any]]] = [
    ("qwen2.5", [SYSTEM, USER], True, {}),
    ("qwen2.5", TOOL_CHAT, True, {}),
    ("qwen3", [SYSTEM, USER], True, {}),
    ("qwen3", TOOL_CHAT, True, {}),
    ("qwen3", [USER], False, {"enable_thinking": False}),
    ("qwen3", [USER, {**ANSWER, "reasoning_content": "It is summer."}, USER], False, {}),
    ("qwen3", [USER, {**ANSWER, "content": "<think>\nhm\n</think>\n\nSunny."}, USER], False, {}),
    ("gemma3", [SYSTEM, USER, ANSWER, USER], False, {}),
    ("phi3", [SYSTEM, USER, ANSWER, USER], False, {}),
    ("mistral", [USER, _call('{"city": "Paris"}'), TOOL_RESULT], True, {}),
    ("mistral", [SYSTEM, USER, ANSWER, USER], True, {}),
]
# (family, chat, what the template says)
REFUSED = [
    ("gemma2", [SYSTEM, USER], "System role not supported"),
    ("gemma2", [USER, USER], "alternate"),
    ("gemma3", [USER, USER], "alternate"),
    ("mixtral", [SYSTEM, USER], "alternate"),
    ("mixtral", [USER, ANSWER, ANSWER], "alternate"),
    ("mistral", [USER, USER], "alternate"),
]


def _tokenizer_dir(path: Path, family: str) -> Path:
    """A tiny word-level tokenizer carrying the family's template and special tokens."""
    spec = FAMILIES[family]
    specials = [t for t in (spec.bos, spec.eos, "<unk>") if t is not None]
    vocab = {token: i for i, token in enumerate([*specials, "Paris", "Weather"])}
    backend = BackendTokenizer(token_models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.save(str(path / "tokenizer.json"))
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": spec.eos,
        "unk_token": "<unk>",
        "chat_template": template_of(family),
    }
    if spec.bos is not None:
        config["bos_token"] = spec.bos
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def _both(tmp_path: Path, family: str) -> tuple[Tokenizer, Any]:
    path = _tokenizer_dir(tmp_path, family)
    return Tokenizer.from_dir(path), transformers.AutoTokenizer.from_pretrained(str(path))


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("chat", PLAIN_CHATS.values(), ids=PLAIN_CHATS.keys())
@pytest.mark.parametrize("gen_prompt", [True, False])
def test_plain_chats_render_as_transformers(
    tmp_path: Path, family: str, chat: list[dict[str, Any]], gen_prompt: bool
) -> None:
    ours, theirs = _both(tmp_path, family)
    expected = theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen_prompt)
    assert ours.render_chat(chat, add_generation_prompt=gen_prompt) == expected
    assert USER["content"] in expected


@pytest.mark.parametrize(
    ("family", "chat", "with_tools", "variables"),
    FEATURES,
    ids=[f"{f}-{i}" for i, (f, *_) in enumerate(FEATURES)],
)
def test_family_features_render_as_transformers(
    tmp_path: Path,
    family: str,
    chat: list[dict[str, Any]],
    with_tools: bool,
    variables: dict[str, Any],
) -> None:
    ours, theirs = _both(tmp_path, family)
    tools = [WEATHER] if with_tools else None
    expected = theirs.apply_chat_template(
        chat, tools=tools, tokenize=False, add_generation_prompt=True, **variables
    )
    assert ours.render_chat(chat, tools=tools, variables=variables) == expected
    if with_tools:  # the template's own tool section, with the definition in it
        assert ours.chat_template_uses_tools and "get_weather" in expected


def test_qwen3_thinking_switch_and_reasoning_history(tmp_path: Path) -> None:
    ours, _ = _both(tmp_path, "qwen3")
    thinking_off = ours.render_chat([USER], variables={"enable_thinking": False})
    assert thinking_off.endswith("<think>\n\n</think>\n\n")
    assert not ours.render_chat([USER]).endswith("</think>\n\n")
    last = [USER, {**ANSWER, "reasoning": "It is summer."}]  # vLLM's name for it
    assert "<think>\nIt is summer.\n</think>" in ours.render_chat(last, False)


def test_gemma3_folds_the_system_message_into_the_first_user_turn(tmp_path: Path) -> None:
    ours, _ = _both(tmp_path, "gemma3")
    text = ours.render_chat([SYSTEM, USER])
    assert "<start_of_turn>user\nYou are terse.\n\nWeather in Paris" in text
    assert "system" not in text


@pytest.mark.parametrize(("family", "chat", "says"), REFUSED)
def test_refusals_are_the_templates_own(
    tmp_path: Path, family: str, chat: list[dict[str, Any]], says: str
) -> None:
    ours, theirs = _both(tmp_path, family)
    with pytest.raises(Exception, match=says):
        theirs.apply_chat_template(chat, tokenize=False)
    with pytest.raises(ValueError, match=f"chat template rejected the messages: .*{says}"):
        ours.render_chat(chat)


def test_reserved_template_variables_are_refused(tmp_path: Path) -> None:
    ours, _ = _both(tmp_path, "qwen3")
    for name in ("messages", "tools", "add_generation_prompt"):
        with pytest.raises(ValueError, match=f"'{name}' is set by the server"):
            ours.render_chat([USER], variables={name: []})


@pytest.mark.parametrize(
    ("family", "parser"),
    [("qwen2.5", "hermes"), ("qwen3", "hermes"), ("mistral", "mistral"), ("mixtral", "json"),
     ("gemma2", "json"), ("gemma3", "json"), ("phi3", "json")],
)  # fmt: skip
def test_the_router_reads_calls_in_the_format_the_template_writes(family: str, parser: str) -> None:
    from router.api.tool_parsers import parser_for

    assert parser_for("auto", template_of(family)).name == parser
