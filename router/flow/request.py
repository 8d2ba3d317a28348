"""What one flow carries to the nodes, and when its time is up."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from cluster.protocol import AdapterRef
from models.sampling_params import SamplingParams
from router.errors import APIError


@dataclass(frozen=True)
class FlowRequest:
    """One request in token ids: what the nodes get, and how the router counts it.

    `timeout_s` is the request's own limit; it shortens the router's request_timeout_s.
    `counts_prompt` is False for the sibling samples of an n > 1 request: the prompt is
    counted once, by sample 0.
    """

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    arrived_at: float
    priority: int = 0
    timeout_s: float | None = None
    counts_prompt: bool = True
    lora: AdapterRef | None = None  # the LoRA adapter the request's `model` names

    def sibling(self, index: int, sampling: SamplingParams) -> FlowRequest:
        """Sample `index` > 0 of the same prompt: its own id and sampling (its own seed)."""
        return replace(
            self, request_id=f"{self.request_id}-{index}", sampling=sampling, counts_prompt=False
        )


@dataclass(frozen=True)
class Deadline:
    """When a request's time is up (time.monotonic()), and whose limit that is."""

    at: float
    own: bool  # the client's `timeout`, shorter than the router's limit

    @classmethod
    def of(cls, request: FlowRequest, limit_s: float) -> Deadline:
        return cls.within(request.arrived_at, request.timeout_s, limit_s)

    @classmethod
    def within(cls, arrived_at: float, timeout_s: float | None, limit_s: float) -> Deadline:
        """`limit_s` after `arrived_at`, or the client's `timeout_s` when shorter."""
        own = timeout_s is not None and timeout_s < limit_s
        return cls(arrived_at + (min(limit_s, timeout_s) if timeout_s else limit_s), own)

    def left_s(self) -> float:
        """Seconds left, at least a millisecond (what a node may still queue the request)."""
        return max(self.at - time.monotonic(), 0.001)

    def error(self) -> APIError:
        """408 when the request's own `timeout` ran out, 504 for the router's limit."""
        if self.own:
            return APIError(
                408, "the request ran past its `timeout`", param="timeout", code="timeout"
            )
        return APIError(
            504, "the request ran past its deadline", type="server_error", code="timeout"
        )
