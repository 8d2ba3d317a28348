"""models.tokenizer against transformers' AutoTokenizer on the default model."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from models import IncrementalDetokenizer, Tokenizer

pytestmark = pytest.mark.model

TEXTS = [
    "Hello, world!",
    "  leading and trailing spaces  ",
    "tabs\tand\nnew\n\nlines\r\n",
    "héllo wörld, ça va? Ñandú, Øresund, ǅ",
    "emoji 👋🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 done",
    "中文文本：你好，世界！日本語のテキスト、한국어 텍스트",
    "def f(x):\n    return {'a': [x ** 2 for _ in range(3)]}  # code\n",
    "Math: ∑ᵢ xᵢ² ≤ ∞ and α→β",
    "<|im_start|>user\nspecial tokens inline<|im_end|>",
    "",
]

CHATS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a prime > 10 🙂"},
    ],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Translate 'chat' into 日本語."},
    ],
]


@pytest.fixture(scope="module")
def tok(default_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(default_model_dir)


@pytest.fixture(scope="module")
def hf(default_model_dir: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(default_model_dir))


def _copy_tokenizer(src: Path, dst: Path, **config: Any) -> Path:
    shutil.copy(src / "tokenizer.json", dst / "tokenizer.json")
    base = json.loads((src / "tokenizer_config.json").read_text())
    base.update(config)
    (dst / "tokenizer_config.json").write_text(json.dumps(base))
    return dst


@pytest.mark.parametrize("add_special", [True, False])
def test_encode_matches_transformers(tok: Tokenizer, hf: Any, add_special: bool) -> None:
    for text in TEXTS:
        assert tok.encode(text, add_special_tokens=add_special) == hf.encode(
            text, add_special_tokens=add_special
        ), text


@pytest.mark.parametrize("skip", [True, False])
def test_decode_matches_transformers(tok: Tokenizer, hf: Any, skip: bool) -> None:
    for text in TEXTS:
        ids = tok.encode(text)
        assert tok.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    assert tok.decode(tok.encode(TEXTS[4])) == TEXTS[4]


def test_special_tokens_and_eos(tok: Tokenizer, hf: Any) -> None:
    assert tok.eos_token_ids == frozenset({hf.eos_token_id})
    assert tok.token_id("eos") == hf.eos_token_id
    assert tok.token_id("bos") == hf.bos_token_id
    assert tok.vocab_size == len(hf)
    assert tok.token_to_str(hf.eos_token_id) == hf.eos_token
    assert tok.token_to_str(tok.encode(" Paris")[0]) == " Paris"


@pytest.mark.parametrize("chat", CHATS)
@pytest.mark.parametrize("gen_prompt", [True, False])
def test_chat_template_matches_transformers(
    tok: Tokenizer, hf: Any, chat: list[dict[str, Any]], gen_prompt: bool
) -> None:
    text = hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen_prompt)
    ids = hf.apply_chat_template(
        chat, tokenize=True, return_dict=False, add_generation_prompt=gen_prompt
    )
    assert tok.render_chat(chat, add_generation_prompt=gen_prompt) == text
    assert tok.apply_chat_template(chat, add_generation_prompt=gen_prompt) == list(ids)


def test_text_parts_are_joined(tok: Tokenizer) -> None:
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    plain = [{"role": "user", "content": "one\ntwo"}]
    assert tok.render_chat([{"role": "user", "content": parts}]) == tok.render_chat(plain)


@pytest.mark.parametrize(
    ("messages", "field"),
    [
        ([{"role": "wizard", "content": "x"}], "role"),
        ([{"content": "x"}], "role"),
        ([{"role": "user", "content": 5}], "content"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "content"),
        ([{"role": "user"}], "content"),
        (["user: hi"], r"messages\[0\]"),
        ([], "messages"),
    ],
)
def test_bad_messages_raise(tok: Tokenizer, messages: list[Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        tok.apply_chat_template(messages)


def test_custom_template_helpers_match_transformers(
    default_model_dir: Path, tmp_path: Path
) -> None:
    transformers = pytest.importorskip("transformers")
    template = (
        "{% set ns = namespace(n=0) %}"
        "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{% set ns.n = ns.n + 1 %}\n"
        "  {{ bos_token }}{{ m.role }} {{ ns.n }}: {{ m | tojson }}\n"
        "{% generation %}{{ m.content | trim }}{% endgeneration %}{{ eos_token }}\n"
        "{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    )
    path = _copy_tokenizer(default_model_dir, tmp_path, chat_template=template)
    chat = [*CHATS[1], {"role": "assistant", "content": '  "11" é '}]
    ours = Tokenizer.from_dir(path)
    theirs = transformers.AutoTokenizer.from_pretrained(str(path))
    expected = theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert ours.render_chat(chat) == expected
    assert "\\u00e9" not in expected  # tojson keeps non-ASCII as is


def test_template_raise_exception_is_value_error(default_model_dir: Path, tmp_path: Path) -> None:
    template = "{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    path = _copy_tokenizer(default_model_dir, tmp_path, chat_template=template)
    with pytest.raises(ValueError, match="user first"):
        Tokenizer.from_dir(path).render_chat([{"role": "system", "content": "x"}])


@pytest.mark.parametrize("post_processor", [True, False])
def test_bos_insertion_follows_tokenizer_json_like_transformers(
    default_model_dir: Path, tmp_path: Path, post_processor: bool
) -> None:
    """tokenizer.json's post-processor decides; add_bos_token in the config does not."""
    transformers = pytest.importorskip("transformers")
    path = _copy_tokenizer(default_model_dir, tmp_path, add_bos_token=not post_processor)
    if post_processor:
        data = json.loads((path / "tokenizer.json").read_text())
        data["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"Sequence": {"id": "A", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {
                "<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}
            },
        }
        (path / "tokenizer.json").write_text(json.dumps(data))
    ours = Tokenizer.from_dir(path)
    theirs = transformers.AutoTokenizer.from_pretrained(str(path))
    assert (ours.encode("Hello there")[0] == ours.token_id("bos")) is post_processor
    for text in TEXTS[:3]:
        assert ours.encode(text) == theirs.encode(text)
        assert ours.encode(text, add_special_tokens=False) == theirs.encode(
            text, add_special_tokens=False
        )


def test_eos_ids_merge_config_files(default_model_dir: Path, tmp_path: Path) -> None:
    path = _copy_tokenizer(default_model_dir, tmp_path)
    (path / "config.json").write_text(json.dumps({"eos_token_id": [0, 2]}))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert Tokenizer.from_dir(path).eos_token_ids == frozenset({0, 2, 7})


def test_missing_or_broken_files_name_the_file(default_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"tokenizer\.json"):
        Tokenizer.from_dir(tmp_path)
    path = _copy_tokenizer(default_model_dir, tmp_path)
    (path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"tokenizer_config\.json"):
        Tokenizer.from_dir(path)
    (path / "tokenizer_config.json").unlink()
    with pytest.raises(ValueError, match=r"tokenizer_config\.json"):
        Tokenizer.from_dir(path)
    (path / "tokenizer_config.json").write_text("{}")
    (path / "tokenizer.json").write_text("garbage")
    with pytest.raises(ValueError, match=r"tokenizer\.json"):
        Tokenizer.from_dir(path)
    no_template = _copy_tokenizer(default_model_dir, tmp_path)
    with pytest.raises(ValueError, match="chat template"):
        Tokenizer.from_dir(no_template).render_chat(CHATS[0])


def _stream(tok: Tokenizer, ids: list[int], **kwargs: Any) -> list[str]:
    detok = IncrementalDetokenizer(tok, **kwargs)
    return [detok.add(i) for i in ids] + [detok.flush()]


@pytest.mark.parametrize("text", TEXTS[3:8])
def test_incremental_detokenization_equals_full_decode(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    pieces = _stream(tok, ids)
    assert "".join(pieces) == tok.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)


def test_incremental_holds_back_partial_characters(tok: Tokenizer) -> None:
    ids = tok.encode("👋")
    assert len(ids) > 1 and "\ufffd" in tok.decode(ids[:1])  # the emoji spans tokens
    detok = IncrementalDetokenizer(tok)
    assert detok.add(ids[0]) == ""
    assert detok.flush() == tok.decode(ids[:1])  # at the end, what is left comes out


def test_incremental_long_stream_with_prompt_and_specials(tok: Tokenizer) -> None:
    prompt = tok.encode("Write a story ")
    text = " ".join(TEXTS[3:8]) * 4  # well past the window trim
    ids = tok.encode(text) + [tok.token_id("eos") or 0]
    pieces = _stream(tok, ids, prompt_ids=prompt)
    assert "".join(pieces) == tok.decode(ids)
    kept = _stream(tok, ids, prompt_ids=prompt, skip_special_tokens=False)
    assert "".join(kept) == tok.decode(ids, skip_special_tokens=False)
    assert kept[-2].endswith("<|im_end|>")


def test_importing_tokenizer_does_not_import_torch() -> None:
    code = (
        "import sys, models.tokenizer\n"
        "bad = [m for m in ('torch', 'transformers', 'engine') if m in sys.modules]\n"
        "print(','.join(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""
