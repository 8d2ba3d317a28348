"""Prompt lookup: guess the next tokens by finding the sequence's latest n-gram earlier in it.

No model: the last n tokens (n from ngram_max down to ngram_min) are searched in the prompt and
output so far, and the tokens that followed their latest earlier occurrence are the guesses.
Text that repeats its input (summaries, edits, extraction, code rewrites) continues a match
often; elsewhere nothing matches and the request decodes plainly.

The search is one vectorised comparison of the last token against the sequence, then the
few places it occurs are extended backwards; each request's tokens are kept in a growing
array, so a step costs no copy of a long prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Match = tuple[int, bool]  # (length of the matched suffix, whether it occurs once earlier)
NO_MATCH: Match = (0, False)


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
        self._tokens: dict[str, _Tokens] = {}

    def propose(self, token_ids: Sequence[int], k: int | None = None) -> list[int]:
        """The tokens that followed the latest earlier occurrence of the longest suffix of
        token_ids that occurs earlier (at most k of them; [] when no suffix does)."""
        return self.lookup(np.asarray(token_ids, dtype=np.int64), k)[0]

    def propose_for(
        self, request_id: str, prompt: Sequence[int], output: Sequence[int], k: int
    ) -> tuple[list[int], Match]:
        """lookup over a request's prompt and output, kept between steps (see forget)."""
        tokens = self._tokens.get(request_id)
        if tokens is None:
            tokens = self._tokens[request_id] = _Tokens(prompt)
        return self.lookup(tokens.sync(len(prompt), output), k)

    def forget(self, request_id: str) -> None:
        self._tokens.pop(request_id, None)

    def lookup(self, tokens: np.ndarray, k: int | None = None) -> tuple[list[int], Match]:
        """propose's guesses and the match they continue: (suffix length, whether the suffix
        occurs only once earlier). Longer and unique matches hold more often."""
        k = self.k if k is None else k
        length = tokens.shape[0]
        if k <= 0 or length < self.ngram_min + 1:
            return [], NO_MATCH
        # ends of earlier occurrences of the last token (each has a token after it)
        ends = np.flatnonzero(tokens[: length - 1] == tokens[length - 1])
        longest = min(self.ngram_max, length - 1)
        n = 1
        while n < longest and ends.size:
            back = ends - n
            longer = ends[(back >= 0) & (tokens[np.maximum(back, 0)] == tokens[length - 1 - n])]
            if longer.size == 0:
                break
            ends, n = longer, n + 1
        if ends.size == 0 or n < self.ngram_min:
            return [], NO_MATCH
        start = int(ends[-1]) + 1
        return tokens[start : start + k].tolist(), (n, ends.size == 1)


class _Tokens:
    """A request's prompt and output as a numpy array that grows with the output."""

    __slots__ = ("array", "length")

    def __init__(self, prompt: Sequence[int]) -> None:
        self.array = np.asarray(prompt, dtype=np.int64)
        self.length = len(prompt)

    def sync(self, prompt_len: int, output: Sequence[int]) -> np.ndarray:
        want = prompt_len + len(output)
        if want < self.length:  # not a continuation: start again
            self.length = prompt_len
        if want > self.length:
            if want > self.array.shape[0]:
                grown = np.empty(max(want, 2 * self.array.shape[0]), dtype=np.int64)
                grown[: self.length] = self.array[: self.length]
                self.array = grown
            self.array[self.length : want] = output[self.length - prompt_len :]
            self.length = want
        return self.array[:want]
