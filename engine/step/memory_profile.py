"""The profiling forward that sizes the KV cache on a GPU.

After the weights are loaded, one forward of the largest step the scheduler may build
(``max_num_batched_tokens`` tokens spread over up to ``max_num_seqs`` prompts, each sampled)
runs against a scratch cache just large enough for it. The allocator's peak above the weights,
less that scratch cache, is the activation peak that engine.kv.sizing keeps free.
"""

from __future__ import annotations

import torch

from engine.kv.cache import KVLayout, allocate_kv_cache
from engine.kv.sizing import DeviceMemory
from engine.model.attention import AttentionMetadata
from engine.model.decoder import DecoderModel


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


def measure_device_memory(
    model: DecoderModel, layout: KVLayout, lengths: list[int], device: torch.device
) -> DeviceMemory:
    """CUDA only: the device's memory around one profiling forward of `lengths`."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    weights = torch.cuda.memory_allocated(device)
    profile_forward(model, layout, lengths, device)
    torch.cuda.synchronize(device)
    scratch = sum(-(-n // layout.block_size) for n in lengths) * layout.block_bytes
    peak = torch.cuda.max_memory_allocated(device) - weights - scratch
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return DeviceMemory(total=total, free=free, weights=weights, activation_peak=max(peak, 0))
