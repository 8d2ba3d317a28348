"""Prompt lookup: guess the next tokens by finding the sequence's latest n-gram earlier in it.

No model: the last n tokens (n from ngram_max down to ngram_min) are searched in the prompt and
output so far, and the tokens that followed their latest earlier occurrence are the guesses.
Text that repeats its input (summaries, edits, extraction, code rewrites) continues a match
often; elsewhere nothing matches and the request decodes plainly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class NgramProposer:
    """Up to k guesses per request from its own tokens."""

    def __init__(self, k: int, ngram_min: int = 1, ngram_max: int = 4) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(
                f"ngram sizes must satisfy 1 <= min <= max, got {ngram_min}, {ngram_max}"
            )
        self.k = k
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max

    def propose(self, token_ids: Sequence[int], k: int | None = None) -> list[int]:
        """The tokens that followed the latest earlier occurrence of the longest suffix of
        token_ids that occurs earlier (at most k of them; [] when no suffix does)."""
        k = self.k if k is None else k
        length = len(token_ids)
        if k <= 0 or length < self.ngram_min + 1:
            return []
        tokens = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.ngram_max, length - 1), self.ngram_min - 1, -1):
            suffix = tokens[length - n :]
            # windows starting at 0 .. length - n - 1: each has a token after it
            windows = sliding_window_view(tokens[: length - 1], n)
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return tokens[start : start + k].tolist()
        return []
