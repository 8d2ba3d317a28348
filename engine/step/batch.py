"""The persistent batch: a row per running request, its block table and sampling settings.

A request gets a row when it is first scheduled and keeps it until it leaves the running
batch (finished, pinned, preempted, aborted: `release`). A step writes only what changed: a
new row's table and settings, and the block ids a sequence gained. Steps are built from the
rows: decodes first (their inputs gathered from the persistent tables in a few tensor ops),
then prefill chunks (built from their token lists, as they carry new tokens anyway).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, chain
from operator import attrgetter
from typing import NamedTuple

import numpy as np
import torch

from engine.lora.delta import LoraBatch
from engine.model.attention import AttentionMetadata
from engine.sampling.rows import SamplingRows, StepSampling
from engine.scheduler.plan import ScheduledChunk, SchedulerOutput
from engine.scheduler.request import Request
from engine.step.chunk_rows import ChunkRowLayout


class StepInputs(NamedTuple):
    """A step's tensors on the device: flattened token ids, attention metadata, sampled rows."""

    input_ids: torch.Tensor  # [tokens] int64
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [sampled] int64: the step's rows to score
    sampling: StepSampling | None  # settings of the sampled rows (None: no batch given)
    lora: LoraBatch | None = None  # the tokens' adapter slots (None: no adapter in the step)
    # every row a plain decode, each scored in order (logits_indices = arange): a step a
    # CUDA graph may replay (engine.step.graphs); False for prefill chunks and chunks laid
    # out as decode rows (speculative guesses)
    plain_decode: bool = False


class PersistentBatch:
    """Rows of up to `max_rows` running requests, on `device`."""

    def __init__(
        self,
        max_rows: int,
        max_blocks: int,
        block_size: int,
        vocab: int,
        device: torch.device,
        seed: int | None = None,
        chunk_rows: ChunkRowLayout | None = None,
    ) -> None:
        """`chunk_rows`: lays some chunks out as decode rows (speculative decoding's)."""
        self.block_size = block_size
        self._chunk_rows = chunk_rows
        self.device = device
        # block_tables: [max_rows, max_blocks] int32; written through a numpy view on the CPU
        self.block_tables = torch.zeros((max_rows, max_blocks), dtype=torch.int32)
        self._tables_np = self.block_tables.numpy()
        if device.type != "cpu":
            self.block_tables = self.block_tables.to(device)
        self._dirty: set[int] = set()
        self._table_len = [0] * max_rows
        self._rows: dict[str, int] = {}
        self._free = list(range(max_rows - 1, -1, -1))
        self.sampling = SamplingRows(max_rows, vocab, device, seed)
        self.last_token = torch.zeros(max_rows, dtype=torch.int64, device=device)
        self._last_rows: list[int] = []
        self._last_decodes: tuple[Request, ...] = ()
        self._last_decode_rows: list[int] = []
        self._last_rows_t = torch.zeros(0, dtype=torch.int64, device=device)
        self._last_sampling: tuple[int, StepSampling] | None = None

    @property
    def num_rows(self) -> int:
        return len(self._rows)

    def row(self, request: Request) -> int:
        """The request's row (given one now if it has none), with its block table current."""
        row = self._rows.get(request.request_id)
        if row is None:
            if not self._free:
                raise RuntimeError("the persistent batch is full (more running than max_num_seqs)")
            row = self._rows[request.request_id] = self._free.pop()
            self._table_len[row] = 0
            params = request.params
            self.sampling.set(row, params, request.prompt_token_ids, request.output_token_ids)
        blocks = request.block_ids
        old = self._table_len[row]
        if len(blocks) != old:
            start = old if len(blocks) > old else 0
            self._tables_np[row, start : len(blocks)] = blocks[start:]
            self._table_len[row] = len(blocks)
            self._dirty.add(row)
        return row

    def record(self, rows: torch.Tensor, token_ids: torch.Tensor) -> None:
        """Rows [n] drew token_ids [n] (device ops): the next step's inputs, token counts."""
        self.last_token.index_copy_(0, rows, token_ids)
        self.sampling.record(rows, token_ids)

    def invalidate(self, request_id: str) -> None:
        """The request's block table changed other than by growing (the blocks of tokens
        computed ahead given back): write its whole table at its next step."""
        row = self._rows.get(request_id)
        if row is not None:
            self._table_len[row] = 0
            self._last_decodes, self._last_decode_rows = (), []

    def release(self, request_id: str) -> None:
        """Free the request's row (no-op when it has none)."""
        row = self._rows.pop(request_id, None)
        if row is not None:
            self._last_decodes, self._last_decode_rows = (), []
            self.sampling.clear(row)
            self._free.append(row)

    # ---- a step's inputs ----------------------------------------------------------------

    def prepare(
        self, out: SchedulerOutput, sampled_prefills: Sequence[Request] | None
    ) -> StepInputs:
        """Inputs of a step. `sampled_prefills`: the requests of its sampled prefill chunks,
        in order (None: the prefill chunks get no rows and the step no sampling settings)."""
        size = self.block_size
        rows = self._decode_rows(out)
        prefill_rows = [self.row(r) for r in sampled_prefills or ()]
        d = len(rows)
        layout = self._chunk_rows
        extra = layout.lay_out(out, self.row) if layout is not None else None
        pre = _prefill_part(out.prefills if extra is None else extra.rest, size, self.device)
        self._flush_tables()
        device = self.device
        rows_t = self._rows_tensor(rows + prefill_rows)
        starts = out.decode_starts
        decode_rows_t = rows_t[:d]
        tokens, pending = _decode_tokens(out.decodes)
        if extra is not None:  # chunks laid out as decode rows, one row per position
            starts = (*starts, *extra.starts)
            decode_rows_t = to_device(rows + extra.rows, device)
            tokens += extra.tokens
        pos, tables, slots, ctx = self._decode_positions(decode_rows_t, starts)
        if d and len(pending) == d and not pre.tokens and extra is None:  # all in flight
            input_ids = self.last_token[rows_t[:d]]  # [d]: where the sampler left them
        elif pending:  # sampled by the step still in flight: read where the sampler left it
            input_ids = to_device(tokens + pre.tokens, device)
            last = self.last_token[rows_t[:d]]  # [d]
            if len(pending) == d:
                input_ids[:d] = last
            else:
                mask = torch.zeros(d, dtype=torch.bool)
                mask[pending] = True
                input_ids[:d] = torch.where(mask.to(device), last, input_ids[:d])
        else:
            input_ids = to_device(tokens + pre.tokens, device)
        meta = pre.meta
        if meta is None:
            meta = _decode_meta(pos, slots, ctx, tables, starts, size)
        elif starts:
            meta = _merge(meta, pos, slots, ctx, tables, starts)
        if extra is not None:
            indices = extra.logit_rows(out, d, len(starts), pre.sampled_rows)
            logits_indices = to_device(indices, device)
        elif pre.sampled_rows:
            indices = list(range(d)) + [d + i for i in pre.sampled_rows]
            logits_indices = to_device(indices, device)
        else:
            logits_indices = torch.arange(d, device=device)
        sampling = None
        if sampled_prefills is not None:
            sampling = self._sampling(rows + prefill_rows, rows_t)
        plain = d > 0 and not pre.tokens and extra is None
        return StepInputs(input_ids, meta, logits_indices, sampling, plain_decode=plain)

    def _decode_positions(
        self, rows: torch.Tensor, starts: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Positions [d] int64, block tables [d, width] int32 (as wide as the longest needs),
        slots [d] int64 and context lengths [d] int32 of decodes in `rows` at `starts`."""
        size, d = self.block_size, len(starts)
        if self.device.type == "cpu":  # numpy on the host tables: a few µs per op less
            pos_np = np.array(starts, dtype=np.int64)
            width = int(pos_np.max()) // size + 1 if d else 0
            tables_np = self._tables_np[rows.numpy(), :width]
            slots_np = tables_np[np.arange(d), pos_np // size].astype(np.int64) * size
            slots_np += pos_np % size
            return (
                torch.from_numpy(pos_np),
                torch.from_numpy(tables_np),
                torch.from_numpy(slots_np),
                torch.from_numpy((pos_np + 1).astype(np.int32)),
            )
        width = max(starts) // size + 1 if d else 0
        pos = to_device(starts, self.device)  # [d]
        tables = self.block_tables[rows, :width]  # [d, width] int32
        slots = tables.gather(1, (pos // size).unsqueeze(1)).squeeze(1).long() * size + pos % size
        return pos, tables, slots, (pos + 1).int()

    def _decode_rows(self, out: SchedulerOutput) -> list[int]:
        """Rows of the decodes. Steady decoding repeats the last step's decodes: then only
        the tables that grew are written, O(changes) instead of a pass over every row."""
        if out.decodes != self._last_decodes:
            self._last_decodes = out.decodes
            self._last_decode_rows = [self.row(r) for r in out.decodes]
        else:
            for request in out.grown:
                self.row(request)
        return self._last_decode_rows

    def _rows_tensor(self, rows: list[int]) -> torch.Tensor:
        """rows as a device tensor; steady decoding samples the same rows step after step."""
        if rows == self._last_rows:
            return self._last_rows_t
        self._last_rows = rows
        self._last_rows_t = to_device(rows, self.device)
        self._last_sampling = None
        return self._last_rows_t

    def _sampling(self, rows: list[int], rows_t: torch.Tensor) -> StepSampling:
        """The rows' settings: gathered again only when the rows or their settings changed
        (the draw counters and token counts change every step: those always)."""
        cached = self._last_sampling
        if cached is not None and cached[0] == self.sampling.version:
            return self.sampling.refresh(cached[1])
        step = self.sampling.gather(rows, rows_t)
        self._last_sampling = (self.sampling.version, step)
        return step

    def _flush_tables(self) -> None:
        """Copy the rows whose tables changed to the device (nothing to do on the CPU)."""
        if self.device.type == "cpu" or not self._dirty:
            return
        dirty = torch.tensor(sorted(self._dirty), dtype=torch.int64)
        host = torch.from_numpy(self._tables_np)[dirty].pin_memory()
        self.block_tables.index_copy_(
            0, dirty.to(self.device), host.to(self.device, non_blocking=True)
        )
        self._dirty.clear()


def _decode_tokens(decodes: Sequence[Request]) -> tuple[list[int], list[int]]:
    """Each decode's input token where the host knows it (0 where it does not), and the
    positions (in the step) of those whose token is still pending."""
    if decodes and min(map(_num_pending, decodes)) > 1:  # steady overlap: all pending
        return [0] * len(decodes), list(range(len(decodes)))
    tokens: list[int] = []
    pending: list[int] = []
    for i, request in enumerate(decodes):
        # one pending token is this step's; a second, the input, is in the step in flight
        if request.num_pending > 1:
            tokens.append(0)
            pending.append(i)
        else:
            tokens.append((request.output_token_ids or request.prompt_token_ids)[-1])
    return tokens, pending


_num_pending = attrgetter("num_pending")


def to_device(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """int64 [len(values)] on `device`. On a GPU through pinned memory, non-blocking: a
    pageable copy would wait for the step still running, and undo the overlap."""
    host = torch.tensor(values, dtype=torch.int64)
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


class _PrefillPart(NamedTuple):
    meta: AttentionMetadata | None  # of the prefill chunks alone
    tokens: list[int]
    sampled_rows: list[int]  # row of each sampled chunk's last token, among the prefills


def _prefill_part(
    chunks: Sequence[ScheduledChunk], block_size: int, device: torch.device
) -> _PrefillPart:
    if not chunks:
        return _PrefillPart(None, [], [])
    meta = AttentionMetadata.build(
        [c.num_tokens for c in chunks],
        [c.start for c in chunks],
        [c.block_table for c in chunks],
        block_size,
        device,
    )
    tokens = list(chain.from_iterable(c.token_ids for c in chunks))
    ends = accumulate(c.num_tokens for c in chunks)
    sampled = [end - 1 for end, c in zip(ends, chunks, strict=True) if c.sample]
    return _PrefillPart(meta, tokens, sampled)


def _decode_meta(
    pos: torch.Tensor,
    slots: torch.Tensor,
    ctx: torch.Tensor,
    tables: torch.Tensor,
    starts: Sequence[int],
    block_size: int,
) -> AttentionMetadata:
    d = pos.shape[0]
    return AttentionMetadata(
        num_decodes=d,
        query_lens=(1,) * d,
        context_lens_host=tuple(map((1).__add__, starts)),
        block_size=block_size,
        positions=pos,
        slot_mapping=slots,
        query_start_loc=torch.arange(d + 1, dtype=torch.int32, device=pos.device),
        context_lens=ctx,
        block_tables=tables,
    )


def _merge(
    pre: AttentionMetadata,
    pos: torch.Tensor,
    slots: torch.Tensor,
    ctx: torch.Tensor,
    tables: torch.Tensor,
    starts: Sequence[int],
) -> AttentionMetadata:
    """Decodes in front of the prefill chunks' metadata (built on the host)."""
    device = pos.device
    d = pos.shape[0]
    width = max(tables.shape[1], pre.block_tables.shape[1])
    both = torch.zeros((d + pre.block_tables.shape[0], width), dtype=torch.int32, device=device)
    both[:d, : tables.shape[1]] = tables
    both[d:, : pre.block_tables.shape[1]] = pre.block_tables.to(device)
    qsl = torch.cat([torch.arange(d, device=device), pre.query_start_loc.to(device) + d])
    return AttentionMetadata(
        num_decodes=d,
        query_lens=(1,) * d + pre.query_lens,
        context_lens_host=tuple(map((1).__add__, starts)) + pre.context_lens_host,
        block_size=pre.block_size,
        positions=torch.cat([pos, pre.positions.to(device)]),
        slot_mapping=torch.cat([slots, pre.slot_mapping.to(device)]),
        query_start_loc=qsl.int(),
        context_lens=torch.cat([ctx, pre.context_lens.to(device)]),
        block_tables=both,
    )
