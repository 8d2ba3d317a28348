"""The profiling forward that sizes the KV cache on a GPU.

After the weights are loaded, one forward of the largest step the scheduler may build
(``max_num_batched_tokens`` tokens spread over up to ``max_num_seqs`` prompts, each sampled)
runs against a scratch cache just large enough for it, and its logits, repeated to
``max_num_seqs`` rows, are sampled in the costliest way a step can ask for (temperature, a
full top-p sort, min-p, penalties, 20 logprobs). A persistent batch of the engine's size with
its penalty tables is held throughout, as the running engine holds its own: everything a
step allocates after the KV plan is inside the measurement. The allocator's peak above the
weights, less that scratch cache, is the activation peak that engine.kv.sizing keeps free.
Then, where the engine will capture decode CUDA graphs, what they will hold is estimated
(``graphs``: engine.step.graphs.estimate_graph_memory) and kept free too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from engine.kv.cache import KVLayout, allocate_kv_cache
from engine.kv.sizing import DeviceMemory
from engine.model.attention import AttentionMetadata
from engine.model.decoder import DecoderModel
from engine.sampling.sampler import sample
from engine.step.batch import PersistentBatch
from models.sampling_params import SamplingParams

# The costliest settings a row can take: a full sort (top-p < 1 without top-k), min-p,
# both penalty tables, the most logprobs.
COSTLIEST = SamplingParams(
    temperature=0.7, top_p=0.9, min_p=0.01, repetition_penalty=1.1, frequency_penalty=0.1,
    logprobs=20,
)  # fmt: skip


def profile_lengths(max_tokens: int, max_seqs: int, max_model_len: int) -> list[int]:
    """Prompt lengths of the largest step: as many tokens as a step may hold, over as many
    prompts as it may hold (one sampled row each), none longer than the context."""
    tokens = min(max_tokens, max_seqs * max_model_len)
    seqs = min(max_seqs, tokens)
    base, extra = divmod(tokens, seqs)
    return [base + 1] * extra + [base] * (seqs - extra)


@torch.inference_mode()
def profile_forward(
    model: DecoderModel, layout: KVLayout, lengths: list[int], device: torch.device
) -> torch.Tensor:
    """One forward of prompts of `lengths` (token 0 repeated) over a scratch cache; returns
    the logits [prompts, vocab] of each prompt's last token."""
    bs = layout.block_size
    tables, first = [], 0
    for n in lengths:
        blocks = -(-n // bs)
        tables.append(list(range(first, first + blocks)))
        first += blocks
    # scratch: [blocks, layers, 2, block_size, kv_heads, head_dim], dropped on return
    scratch = allocate_kv_cache(layout, first, device)
    meta = AttentionMetadata.build(lengths, [0] * len(lengths), tables, bs, device)
    input_ids = torch.zeros(sum(lengths), dtype=torch.int64, device=device)  # [tokens]
    last_rows = torch.tensor(lengths, device=device).cumsum(0) - 1  # [prompts]
    return model(input_ids, meta, scratch, last_rows)


class BatchShape(NamedTuple):
    """The engine's persistent batch: rows (max_num_seqs), block-table width, vocabulary."""

    rows: int
    blocks: int
    vocab: int


def profile_batch(shape: BatchShape, block_size: int, device: torch.device) -> PersistentBatch:
    """A persistent batch of `shape`, every row set to the costliest sampling (so its
    penalty tables exist)."""
    batch = PersistentBatch(shape.rows, shape.blocks, block_size, shape.vocab, device)
    for row in range(shape.rows):
        batch.sampling.set(row, COSTLIEST, (0,), ())
    return batch


@torch.inference_mode()
def profile_sampling(logits: torch.Tensor, batch: PersistentBatch) -> torch.Tensor:
    """Sample every row of ``batch`` from ``logits`` [prompts, vocab] repeated to its rows;
    returns the tokens [rows]."""
    rows = batch.sampling.greedy.shape[0]
    rows_t = torch.arange(rows, device=logits.device)
    step = batch.sampling.gather(list(range(rows)), rows_t)
    repeated = logits.float()[rows_t % logits.shape[0]]  # [rows, vocab]
    return sample(repeated, step, kernel=False).token_ids


def measure_device_memory(
    model: DecoderModel,
    layout: KVLayout,
    lengths: list[int],
    device: torch.device,
    batch_shape: BatchShape,
    graphs: Callable[[], int] | None = None,
) -> DeviceMemory:
    """CUDA only: the device's memory around one profiling step of `lengths`, sampled, with
    a persistent batch of `batch_shape` held, and `graphs`' estimate of what the CUDA graphs
    will hold (module docstring)."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    weights = torch.cuda.memory_allocated(device)
    batch = profile_batch(batch_shape, layout.block_size, device)
    profile_sampling(profile_forward(model, layout, lengths, device), batch)
    del batch
    torch.cuda.synchronize(device)
    scratch = sum(-(-n // layout.block_size) for n in lengths) * layout.block_bytes
    peak = torch.cuda.max_memory_allocated(device) - weights - scratch
    graph_bytes = graphs() if graphs is not None else 0
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return DeviceMemory(
        total=total, free=free, weights=weights, activation_peak=max(peak, 0), graphs=graph_bytes
    )
