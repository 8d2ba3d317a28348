"""A step cut into micro-batches for the pipeline stages: contiguous runs of its sequences
(decodes first, then prefill chunks, as the step lays them out), balanced by tokens.

Every rank cuts the same step the same way (the cut depends on the host lengths only), so
micro-batch ``k`` of one stage is micro-batch ``k`` of the next. Sequences are never split:
a step of one long prefill chunk is one micro-batch.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left
from itertools import accumulate, pairwise

from engine.model.attention import AttentionMetadata
from engine.step.batch import StepInputs


def cut_points(query_lens: tuple[int, ...], parts: int) -> list[int]:
    """Sequence indices ``[0, c_1, .., num_seqs]`` of ``min(parts, num_seqs)`` non-empty
    runs whose token counts are as even as whole sequences allow."""
    seqs = len(query_lens)
    n = max(1, min(parts, seqs))
    starts = list(accumulate(query_lens, initial=0))  # token offset of each sequence
    cuts = [0]
    for k in range(1, n):
        # the first sequence starting at or past k/n of the tokens, leaving a sequence for
        # each run still to come
        cuts.append(bisect_left(starts, k * starts[-1] / n, cuts[-1] + 1, seqs - (n - k)))
    cuts.append(seqs)
    return cuts


def split_step(inputs: StepInputs, parts: int) -> list[StepInputs]:
    """``inputs`` as up to ``parts`` micro-batches (their logits, concatenated in order,
    are the step's)."""
    meta = inputs.meta
    cuts = cut_points(meta.query_lens, parts)
    if len(cuts) == 2:
        return [inputs]
    token_at = list(accumulate(meta.query_lens, initial=0))
    sampled = inputs.logits_indices.tolist()
    out = []
    for lo, hi in pairwise(cuts):
        t0, t1 = token_at[lo], token_at[hi]
        rows = [i - t0 for i in sampled if t0 <= i < t1]
        indices = inputs.logits_indices.new_tensor(rows)
        out.append(
            StepInputs(inputs.input_ids[t0:t1], slice_meta(meta, lo, hi, t0, t1), indices, None)
        )
    return out


def slice_meta(meta: AttentionMetadata, lo: int, hi: int, t0: int, t1: int) -> AttentionMetadata:
    """The metadata of sequences ``lo .. hi - 1``, whose tokens are ``t0 .. t1 - 1``."""
    return dataclasses.replace(
        meta,
        num_decodes=max(0, min(meta.num_decodes, hi) - lo),
        query_lens=meta.query_lens[lo:hi],
        context_lens_host=meta.context_lens_host[lo:hi],
        positions=meta.positions[t0:t1],
        slot_mapping=meta.slot_mapping[t0:t1],
        query_start_loc=meta.query_start_loc[lo : hi + 1] - t0,
        context_lens=meta.context_lens[lo:hi],
        block_tables=meta.block_tables[lo:hi],
    )
