"""Constrained decoding: one llguidance matcher per constrained request, and the token mask.

A request's `SamplingParams.grammar` is an llguidance grammar (the router compiles
`response_format` and forced tool calls into one). Each step, the masks of the step's
constrained rows are computed in a worker thread while the forward runs (llguidance drops the
GIL and spreads the rows over its own threads), then applied to the logits before the draw:
tokens the grammar does not allow get -inf. After the step the matchers consume the sampled
tokens. A finished grammar allows only EOS, so the request ends with finish_reason "stop".

A request that arrives with tokens already generated (imported, or resumed on another decode
node) rebuilds its matcher by feeding them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import llguidance
import llguidance.numpy
import numpy as np
import torch

from engine.cpu_kernels.threads import serial_torch_ops


class GrammarMasks(NamedTuple):
    """The masks of one step's constrained rows."""

    positions: torch.Tensor  # int64 [g]: their positions in the step
    refused: torch.Tensor  # bool [g, vocab]: True where the grammar refuses the token
    every_row: bool = False  # positions are 0 .. n - 1: the mask covers the whole step


def apply_grammar_mask(logits: torch.Tensor, masks: GrammarMasks | None) -> torch.Tensor:
    """logits: [n, vocab] float32, not modified; -inf on refused tokens of masked rows."""
    if masks is None:
        return logits
    if masks.every_row:  # one pass when every row is constrained
        return logits.masked_fill(masks.refused, float("-inf"))
    rows = logits.index_select(0, masks.positions).masked_fill_(masks.refused, float("-inf"))
    return logits.index_copy(0, masks.positions, rows)


def unpack_bitmask(bitmask: np.ndarray, vocab: int, device: torch.device) -> torch.Tensor:
    """int32 [g, words] (bit j of word w: token 32 w + j) -> bool [g, vocab] on `device`.
    Tokens past the bitmask (a model vocabulary padded beyond the tokenizer's) are refused."""
    words = torch.from_numpy(bitmask).to(device)  # [g, words]
    bits = torch.arange(32, dtype=torch.int32, device=device)
    allowed = ((words.unsqueeze(-1) >> bits) & 1).bool().flatten(1)  # [g, words * 32]
    if allowed.shape[1] >= vocab:
        return allowed[:, :vocab]
    pad = torch.zeros((allowed.shape[0], vocab - allowed.shape[1]), dtype=torch.bool, device=device)
    return torch.cat([allowed, pad], dim=1)


class MaskJob(NamedTuple):
    """Masks being computed for a step (None: no constrained row)."""

    future: Future[GrammarMasks] | None

    def result(self) -> GrammarMasks | None:
        return self.future.result() if self.future is not None else None


class GrammarError(ValueError):
    """A grammar the matcher refuses, or tokens so far that it does not accept."""


class Grammars:
    """Matchers of the engine's constrained requests, by request id.

    The llguidance tokenizer (about 1.5 s to build) is made at the first constrained request.
    """

    def __init__(self, model_dir: Path, vocab: int, eos_token_ids: Iterable[int]) -> None:
        self._model_dir = Path(model_dir)
        self._vocab = vocab
        self._eos = sorted(eos_token_ids)
        self._tokenizer: Any = None
        self._tokenizer_lock = threading.Lock()
        self._executor: Any = None
        self._matchers: dict[str, Any] = {}
        self._pool: ThreadPoolExecutor | None = None
        self.mask_seconds = 0.0  # worker time computing masks, summed over steps
        self.mask_steps = 0  # steps that computed masks

    @property
    def active(self) -> bool:
        """True while some request of the engine is constrained."""
        return bool(self._matchers)

    def __len__(self) -> int:
        return len(self._matchers)

    def add(self, request_id: str, grammar: str, output_token_ids: Sequence[int] = ()) -> None:
        """Make (or remake) the request's matcher and feed it the tokens generated so far."""
        matcher = llguidance.LLMatcher(self._llg_tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"request {request_id}: bad grammar: {matcher.get_error()}")
        for token in output_token_ids:
            if not matcher.consume_token(token):
                raise GrammarError(
                    f"request {request_id}: the tokens so far do not match its grammar "
                    f"({matcher.get_error()})"
                )
        self._matchers[request_id] = matcher

    def forget(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)

    def consume(self, request_ids: Sequence[str], token_ids: Sequence[int]) -> None:
        """The step's sampled tokens, for the rows that are constrained. A token the matcher
        refuses (it cannot happen with the mask applied) leaves it in its error state, where
        its mask allows only EOS."""
        matchers = self._matchers
        for request_id, token in zip(request_ids, token_ids, strict=True):
            matcher = matchers.get(request_id)
            if matcher is not None:
                matcher.consume_token(token)

    def start(self, request_ids: Sequence[str], device: torch.device) -> MaskJob:
        """Begin computing the masks of these rows (step order) in the worker thread."""
        rows = [(i, m) for i, r in enumerate(request_ids) if (m := self._matchers.get(r))]
        if not rows:
            return MaskJob(None)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                1, thread_name_prefix="grammar-mask", initializer=serial_torch_ops
            )
        return MaskJob(self._pool.submit(self._masks, rows, len(request_ids), device))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    # ---- internals ----------------------------------------------------------------------

    def _masks(
        self, rows: list[tuple[int, Any]], n_rows: int, device: torch.device
    ) -> GrammarMasks:
        start = time.perf_counter()
        tok = self._llg_tokenizer()
        bitmask = llguidance.numpy.allocate_token_bitmask(len(rows), tok.vocab_size)
        pairs = [(m, j) for j, (_, m) in enumerate(rows)]
        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        llguidance.numpy.fill_next_token_bitmask_par(self._executor, pairs, bitmask)
        words = bitmask.view(np.uint32)  # [g, words], the same memory
        for j, (_, m) in enumerate(rows):
            if m.is_error():  # only EOS: the request ends
                words[j] = 0
                for eos in self._eos:
                    words[j, eos // 32] |= np.uint32(1 << (eos % 32))
        at = [i for i, _ in rows]
        positions = torch.tensor(at, dtype=torch.int64, device=device)
        refused = unpack_bitmask(bitmask, self._vocab, device).logical_not_()
        masks = GrammarMasks(positions, refused, every_row=at == list(range(n_rows)))
        self.mask_seconds += time.perf_counter() - start
        self.mask_steps += 1
        return masks

    def _llg_tokenizer(self) -> Any:
        with self._tokenizer_lock:
            if self._tokenizer is None:
                text = (self._model_dir / "tokenizer.json").read_text(encoding="utf-8")
                self._tokenizer = llguidance.LLTokenizer(text, eos_token=self._eos or None)
            return self._tokenizer
