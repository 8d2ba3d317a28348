"""Decode role: requests whose KV is written from outside (disaggregated prefill), holding
their blocks until the KV has arrived, not yet scheduled."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.kv.block_manager import BlockManager
from engine.scheduler.plan import ImportPlan
from engine.scheduler.request import Request


@dataclass
class HeldImport:
    request: Request
    output_token_ids: list[int]  # generated elsewhere, appended at admission

    def admit(self) -> Request:
        """The KV is written: the request with its tokens, all but the last computed."""
        request = self.request
        request.output_token_ids.extend(self.output_token_ids)
        request.num_computed_tokens = request.num_tokens - 1
        return request


class HeldImports:
    """The requests being imported, by id."""

    def __init__(self, blocks: BlockManager) -> None:
        self._blocks = blocks
        self._held: dict[str, HeldImport] = {}

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._held

    def reserve(
        self, request: Request, output_token_ids: Sequence[int], state_blocks: int = 0
    ) -> ImportPlan | None:
        """Blocks for the request's prompt and output_token_ids (the local prefix cache's
        first), and ``state_blocks`` more at the end for a state record (the request's
        next tokens fill them once it is read); where the KV from outside goes. None: not
        enough blocks, nothing changed."""
        num_tokens = request.num_tokens + len(output_token_ids)
        all_tokens = request.prompt_token_ids + list(output_token_ids)
        root = request.hash_root
        hits = self._blocks.match_prefix(all_tokens, root)
        lower = self._blocks.match_lower(all_tokens, hits, root)  # loaded before its first step
        size = self._blocks.block_size
        reserved = num_tokens
        if state_blocks:  # whole blocks of tokens, then the record's
            reserved = (self._blocks.blocks_for(num_tokens) + state_blocks) * size
        if not self._blocks.allocate(request, reserved, hits, lower):
            return None
        self._held[request.request_id] = HeldImport(request, list(output_token_ids))
        return ImportPlan(
            block_ids=tuple(request.block_ids),
            num_cached_tokens=request.num_cached_tokens,
            num_kv_tokens=num_tokens - 1,
            block_size=size,
            num_state_blocks=state_blocks,
        )

    def take(self, request_id: str) -> HeldImport | None:
        """The held import, no longer held (None: none with that id)."""
        return self._held.pop(request_id, None)
