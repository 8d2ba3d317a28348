"""Each GGUF block type decodes to codes, scales and mins whose ``code * scale + min`` is the
value gguf's own dequantizer gives, bit for bit."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from engine.model.quant.gguf_blocks import BLOCKS, decode_blocks
from engine.model.quant.weight import QuantWeight

# byte offsets of each type's half-precision fields (the rest of a block is any bytes)
HALVES = {"Q4_0": [0], "Q4_1": [0, 2], "Q8_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def random_blocks(kind: str, rows: int, cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    per_block, size = GGML_QUANT_SIZES[T[kind]]
    raw = rng.integers(0, 256, size=(rows, cols // per_block * size), dtype=np.uint8)
    blocks = raw.reshape(-1, size)
    for at in HALVES[kind]:  # finite, of either sign
        half = (rng.standard_normal(len(blocks)) * 0.05).astype(np.float16)
        blocks[:, at : at + 2] = half.view(np.uint8).reshape(-1, 2)
    return raw


@pytest.mark.parametrize("kind", list(BLOCKS))
def test_values_are_ggmls(kind: str) -> None:
    rows, cols = 32, 512
    raw = random_blocks(kind, rows, cols, seed=len(kind))
    expected = gguf.quants.dequantize(raw, T[kind]).reshape(rows, cols)
    rows_q = decode_blocks(kind, raw, rows, cols)
    # equal as numbers (Q4_0's d (q - 8) may be -0.0 where ours is +0.0)
    assert np.array_equal(rows_q.dequantize().numpy(), expected)
    assert np.array_equal(QuantWeight(rows_q).dequantize().numpy(), expected)
    nonzero = expected != 0
    assert nonzero.mean() > 0.9


def test_rows_that_are_not_whole_blocks_are_refused() -> None:
    with pytest.raises(ValueError, match="Q4_K rows of 96 are not whole blocks of 256"):
        decode_blocks("Q4_K", np.zeros(144, np.uint8), 1, 96)
