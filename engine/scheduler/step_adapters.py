"""The scheduler's limit of distinct LoRA adapters in one step (the device slots of
engine.lora.slots). Integers and names only, no tensors."""

from __future__ import annotations

from engine.scheduler.request import Request


class StepAdapters:
    """The distinct adapters of the step being planned, at most `limit`: a request under
    another adapter waits for a later step."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.names: set[str] = set()

    def admits(self, request: Request) -> bool:
        """True (and its adapter counted) when the request may run in this step."""
        lora = request.lora
        if lora is None or lora.lora_name in self.names:
            return True
        if len(self.names) >= self.limit:
            return False
        self.names.add(lora.lora_name)
        return True
