"""Request state shared by the scheduler (integers) and the engine."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum, StrEnum

from engine.lora.request import LoRARequest
from models.sampling_params import SamplingParams


class RequestStatus(Enum):
    WAITING = "waiting"  # queued, no blocks (new or preempted)
    RUNNING = "running"  # has blocks, being computed or decoded
    PINNED = "pinned"  # prefill role: first token out, blocks held until released
    FINISHED = "finished"


class FinishReason(StrEnum):
    STOP = "stop"  # EOS or a stop token
    LENGTH = "length"  # max_tokens or context length reached
    ABORT = "abort"  # cancelled by the caller
    PREFILLED = "prefilled"  # prefill role: first token produced, KV handed off


@dataclass(eq=False)
class Request:
    """One sequence. Token ids only; the scheduler and block manager own the integer fields."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    max_model_len: int = 2048
    arrival_time: float = field(default_factory=time.monotonic)
    output_token_ids: list[int] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    num_cached_tokens: int = 0  # of those, found in the prefix cache at admission
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    num_preemptions: int = 0
    priority: int = 0  # lower is served first; ties go by arrival
    # sampled in a scheduled step, not yet appended: 0, or 1-2 with overlapped scheduling
    num_pending: int = 0
    # speculative decoding: tokens guessed for the positions after the last one, to be
    # verified by the next step (engine.speculative); empty when not speculating
    draft_token_ids: list[int] = field(default_factory=list)
    # preempted by swapping: the host-tier slots holding its blocks' KV, in block order
    # (engine.kv.tiered_blocks); empty otherwise
    swapped_slots: list[int] = field(default_factory=list)
    # leading blocks given back behind a sliding window (every layer windowed): their
    # entries in block_ids are placeholders no kernel reads (engine.kv.block_manager)
    num_released_blocks: int = 0
    # the LoRA adapter it runs under (None: the base model); its blocks hash from the
    # adapter's root, so KV is never shared across adapters (models.block_hash)
    lora: LoRARequest | None = None
    # set from params at construction: tokens that end the request, and its longest length
    stop_ids: frozenset[int] = field(init=False)
    token_limit: int = field(init=False)

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id}: prompt_token_ids is empty")
        eos = frozenset() if self.params.ignore_eos else self.eos_token_ids
        self.stop_ids = eos | frozenset(self.params.stop_token_ids)
        prompt = len(self.prompt_token_ids)
        self.token_limit = min(prompt + self.params.max_tokens, self.max_model_len)

    @property
    def hash_root(self) -> int | None:
        """The parent hash of the request's first KV block."""
        return self.lora.hash_root if self.lora is not None else None

    @property
    def owned_block_ids(self) -> list[int]:
        """The blocks the request holds: its table without the released placeholders."""
        return self.block_ids[self.num_released_blocks :]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Tokens of the sequence, counting the pending ones (the scheduler's view)."""
        return len(self.prompt_token_ids) + len(self.output_token_ids) + self.num_pending

    @property
    def num_known_tokens(self) -> int:
        """Tokens whose ids are known: prompt + appended outputs."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def at_length_limit(self) -> bool:
        """With its pending tokens, the request has all the tokens max_tokens and the context
        allow: the next one is not to be computed, whatever the pending token is."""
        return self.num_tokens >= self.token_limit

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def check_stop(self) -> FinishReason | None:
        """Stop reason after the latest appended token, or None to continue."""
        if self.output_token_ids[-1] in self.stop_ids:
            return FinishReason.STOP  # EOS (unless ignore_eos) or a stop token
        if len(self.prompt_token_ids) + len(self.output_token_ids) >= self.token_limit:
            return FinishReason.LENGTH  # max_tokens or the context length
        return None
