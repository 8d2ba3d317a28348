"""The batch sizes the decode graphs are captured for, and the fixed input buffers they read.

A CUDA graph replays the kernels it captured on the same addresses: a decode step of ``d``
rows runs the graph of the smallest captured size ``n >= d`` after its inputs are copied
into the first ``d`` rows of these buffers. Rows ``d .. n - 1`` are padding: their slot is
``PAD_SLOT``, so the KV writers skip them, their context is one token (the attention reads a
single key of a block id the row held before, or block 0: any block, only read), and they
run under no adapter. Their logits are computed and never looked at.
"""

from __future__ import annotations

from bisect import bisect_left

import torch

from engine.model.attention import AttentionMetadata
from engine.step.batch import StepInputs
from engine.triton_kernels import PAD_SLOT

NO_ADAPTER = -1  # a row's adapter slot in the LoRA kernels: none


def capture_sizes(max_rows: int) -> tuple[int, ...]:
    """vLLM's bucket list: 1, 2, 4, every 8 up to 256, then every 16, up to ``max_rows``
    (the largest step a decode batch can be), which is always one of them."""
    if max_rows < 1:
        raise ValueError(f"capture sizes need max_rows >= 1, got {max_rows}")
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, max_rows + 1, 16)]
    kept = [n for n in sizes if n < max_rows]
    return (*kept, max_rows)


def bucket_for(sizes: tuple[int, ...], rows: int) -> int | None:
    """The smallest of ``sizes`` (ascending) that holds ``rows`` (None: none does)."""
    i = bisect_left(sizes, rows)
    return sizes[i] if i < len(sizes) and rows >= 1 else None


class GraphInputs:
    """The decode graphs' input buffers: ``max_rows`` rows on ``device``, every row padding
    until a step fills it."""

    def __init__(
        self, max_rows: int, max_blocks: int, block_size: int, device: torch.device, lora: bool
    ) -> None:
        """`max_blocks`: the block-table width (the persistent batch's); `lora`: keep each
        row's adapter slot too (the graphs then run the LoRA kernels)."""
        i64 = torch.int64
        self.block_size = block_size
        self.input_ids = torch.zeros(max_rows, dtype=i64, device=device)  # [rows]
        self.positions = torch.zeros(max_rows, dtype=i64, device=device)  # [rows]
        self.slot_mapping = torch.full((max_rows,), PAD_SLOT, dtype=i64, device=device)
        self.context_lens = torch.ones(max_rows, dtype=torch.int32, device=device)  # [rows]
        # block_tables: [rows, max_blocks] int32
        self.block_tables = torch.zeros((max_rows, max_blocks), dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(max_rows + 1, dtype=torch.int32, device=device)
        self.logits_indices = torch.arange(max_rows, dtype=i64, device=device)  # every row
        self.token_slots = (
            torch.full((max_rows,), NO_ADAPTER, dtype=i64, device=device) if lora else None
        )
        self._live = 0  # rows 0 .. _live - 1 hold the last step's values; the rest padding

    @property
    def max_rows(self) -> int:
        return self.input_ids.shape[0]

    def meta(self, rows: int) -> AttentionMetadata:
        """The metadata a graph of ``rows`` rows is captured with: views of the buffers, and
        as host-side lengths the longest context the tables can hold (the attention plans
        its splits for it: the graph serves every context length)."""
        longest = self.block_tables.shape[1] * self.block_size
        return AttentionMetadata(
            num_decodes=rows,
            query_lens=(1,) * rows,
            context_lens_host=(longest,) * rows,
            block_size=self.block_size,
            positions=self.positions[:rows],
            slot_mapping=self.slot_mapping[:rows],
            query_start_loc=self.query_start_loc[: rows + 1],
            context_lens=self.context_lens[:rows],
            block_tables=self.block_tables[:rows],
        )

    def load(self, inputs: StepInputs) -> int:
        """Copy a plain decode step's inputs into the first rows (device copies, no sync);
        rows the previous step held beyond them become padding. Returns the step's rows."""
        meta = inputs.meta
        d = meta.num_decodes
        if not inputs.plain_decode or d > self.max_rows:
            raise ValueError(f"not a plain decode step of at most {self.max_rows} rows")
        self.input_ids[:d].copy_(inputs.input_ids, non_blocking=True)
        self.positions[:d].copy_(meta.positions, non_blocking=True)
        self.slot_mapping[:d].copy_(meta.slot_mapping, non_blocking=True)
        self.context_lens[:d].copy_(meta.context_lens, non_blocking=True)
        tables = meta.block_tables  # [d, width]
        self.block_tables[:d, : tables.shape[1]].copy_(tables, non_blocking=True)
        if self.token_slots is not None:
            lora = inputs.lora
            if lora is None:
                self.token_slots[:d].fill_(NO_ADAPTER)
            else:
                self.token_slots[:d].copy_(lora.token_slots, non_blocking=True)
        if d < self._live:
            self._pad(d, self._live)
        self._live = d
        return d

    def _pad(self, start: int, end: int) -> None:
        """Rows start .. end - 1 back to padding: no KV write, one key read, no adapter."""
        self.slot_mapping[start:end].fill_(PAD_SLOT)
        self.context_lens[start:end].fill_(1)
        if self.token_slots is not None:
            self.token_slots[start:end].fill_(NO_ADAPTER)
