"""A byte-level tokenizer for the tiny random models: one token per byte, so that any text
(JSON included) can be spelled, and a grammar library has every byte to choose from."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2: eos is 2, as in tiny_llama.TINY
VOCAB = len(SPECIALS) + 256  # the model may pad its vocabulary beyond this


def save_byte_tokenizer(path: Path) -> Tokenizer:
    """Write tokenizer.json (+ tokenizer_config.json) into `path` and return the tokenizer."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    vocab |= {ch: len(SPECIALS) + i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    tok.save(str(path / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return tok
