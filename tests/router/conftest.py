"""Fixtures of the router tests: the default model's tokenizer and scripted token ids."""

from __future__ import annotations

from pathlib import Path

import pytest
from router_fakes import ANSWER

from models.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def tokenizer(default_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(default_model_dir)


@pytest.fixture(scope="session")
def script(tokenizer: Tokenizer) -> list[int]:
    """Token ids of ANSWER followed by EOS: what the fake nodes generate."""
    eos = min(tokenizer.eos_token_ids)
    return tokenizer.encode(ANSWER, add_special_tokens=False) + [eos]
