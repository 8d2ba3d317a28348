"""The scheduler's limit of distinct LoRA adapters in one step: names only, no tensors."""

from __future__ import annotations

from engine.lora.request import LoRARequest
from engine.scheduler.request import Request
from engine.scheduler.step_adapters import StepAdapters
from models.sampling_params import SamplingParams


def _request(request_id: str, adapter: str | None) -> Request:
    lora = LoRARequest(adapter, 1, "unused") if adapter is not None else None
    return Request(request_id, [1, 2, 3], SamplingParams(), lora=lora)


def test_a_step_admits_at_most_limit_distinct_adapters_and_any_base_request() -> None:
    step = StepAdapters(limit=2)
    assert step.admits(_request("a", "sql"))
    assert step.admits(_request("b", "chat"))
    assert not step.admits(_request("c", "math"))  # a third adapter waits for a later step
    assert step.admits(_request("d", "sql"))  # an adapter already in the step
    assert step.admits(_request("e", None))  # the base model needs no slot
    assert step.names == {"sql", "chat"}
