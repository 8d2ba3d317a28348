"""A harmony model's tokenizer for tests: the default model's vocabulary with gpt-oss's
special tokens added (so the router renders and reads harmony), no chat template."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tokenizers import AddedToken
from tokenizers import Tokenizer as BackendTokenizer

from models.tokenizer import Tokenizer

HARMONY_SPECIALS = (
    "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>",
    "<|call|>",
)  # fmt: skip


def harmony_tokenizer_dir(default_model_dir: Path, path: Path, pieces: Sequence[str] = ()) -> Path:
    """The default model's tokenizer files in `path`, the harmony tokens added (after its
    vocabulary), `<|return|>` its EOS. `pieces`: plain tokens added to the vocabulary before
    them (never made by encoding, but decoded: more ways to spell a text)."""
    path.mkdir(parents=True, exist_ok=True)
    data = json.loads((default_model_dir / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    for piece in pieces:
        if piece in vocab:
            raise ValueError(f"{piece!r} is in the vocabulary already")
        vocab[piece] = len(vocab)
    backend = BackendTokenizer.from_str(json.dumps(data))
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in HARMONY_SPECIALS]
    )
    backend.save(str(path / "tokenizer.json"))
    config = json.loads((default_model_dir / "tokenizer_config.json").read_text())
    config |= {"eos_token": "<|return|>", "pad_token": "<|end|>"}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def harmony_tokenizer(default_model_dir: Path, path: Path) -> Tokenizer:
    return Tokenizer.from_dir(harmony_tokenizer_dir(default_model_dir, path))
