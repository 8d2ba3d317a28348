"""A reasoning model's tokenizer for router tests: the default model's vocabulary with a
Qwen3-shaped chat template (thinking in `<think>...</think>`, `enable_thinking: false` closes
it in the prompt) or a DeepSeek-R1-shaped one (the prompt opens `<think>`)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from tokenizers import AddedToken
from tokenizers import Tokenizer as BackendTokenizer

from models.tokenizer import Tokenizer

QWEN3_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.role == 'assistant' and message.reasoning_content %}"
    "{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
DEEPSEEK_R1_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)


def thinking_tokenizer(
    default_model_dir: Path, path: Path, template: str, added: Sequence[str] = ()
) -> Tokenizer:
    """The default model's tokenizer files in `path`, with `template` as its chat template;
    `added`: texts made single tokens after the vocabulary (as Qwen3's `<think>`: not special,
    so they decode into the text)."""
    path.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_dir / name, path / name)
    if added:
        backend = BackendTokenizer.from_file(str(path / "tokenizer.json"))
        backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
        backend.save(str(path / "tokenizer.json"))
    (path / "chat_template.jinja").write_text(template)
    return Tokenizer.from_dir(path)


def script_of(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of `text` and EOS: what fake nodes generate."""
    return tokenizer.encode(text, add_special_tokens=False) + [min(tokenizer.eos_token_ids)]
