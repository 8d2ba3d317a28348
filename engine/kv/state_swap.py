"""Swap space for a hybrid model's linear-attention states: a request preempted by swapping
(its KV blocks to the host tier, engine.scheduler.swap) keeps its conv and recurrent states
in host memory, at most ``capacity`` requests' at once; they are copied back into a slot of
the pool when it resumes, and dropped when it is aborted. With no room left the request is
recomputed instead (the scheduler reserves room before it swaps a request's blocks out).
"""

from __future__ import annotations

import torch


class StateSwap:
    """Host copies of preempted requests' states, by request id."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"StateSwap needs a capacity >= 1, got {capacity}")
        self.capacity = capacity
        # request id -> (conv, recurrent) host copies; None: room reserved, not copied yet
        self._copies: dict[str, tuple[torch.Tensor, torch.Tensor] | None] = {}
        self.swapped_out = 0  # totals
        self.swapped_in = 0

    def reserve(self, request_id: str) -> bool:
        """Room for the request's states (the scheduler, before it swaps the request out);
        False when the space is full."""
        if request_id not in self._copies and len(self._copies) >= self.capacity:
            return False
        self._copies.setdefault(request_id, None)
        return True

    def release(self, request_id: str) -> None:
        """Drop the request's room and copy (no-op when it holds none)."""
        self._copies.pop(request_id, None)

    def awaits_copy(self, request_id: str) -> bool:
        return request_id in self._copies and self._copies[request_id] is None

    def holds_copy(self, request_id: str) -> bool:
        return self._copies.get(request_id) is not None

    def put(self, request_id: str, conv: torch.Tensor, recurrent: torch.Tensor) -> None:
        """Copy a slot's states (conv, recurrent) to host memory, into the reserved room."""
        if not self.awaits_copy(request_id):
            raise RuntimeError(f"request {request_id} has no room reserved in the state swap")
        self._copies[request_id] = (conv.to("cpu", copy=True), recurrent.to("cpu", copy=True))
        self.swapped_out += 1

    def take(self, request_id: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The request's host copies, its room freed."""
        copies = self._copies.pop(request_id, None)
        if copies is None:
            raise RuntimeError(f"request {request_id} has no state in the swap space")
        self.swapped_in += 1
        return copies

    @property
    def num_used(self) -> int:
        """Requests holding room (reserved or copied)."""
        return len(self._copies)

    @property
    def num_bytes(self) -> int:
        """Host bytes the copies take."""
        return sum(
            c.numel() * c.element_size() + r.numel() * r.element_size()
            for c, r in filter(None, self._copies.values())
        )
