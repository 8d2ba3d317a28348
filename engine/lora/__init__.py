"""Multi-LoRA serving: PEFT adapters applied per row, many adapters in one forward.

- ``request``: ``LoRARequest(name, id, path)``, what a request names (exported by ``engine``).
- ``adapter``: reads a PEFT directory (``adapter_config.json`` + ``adapter_model.safetensors``)
  into per-layer A and scaled B matrices; bad files raise ``LoraLoadError`` naming the file.
- ``slots``: the device slots, adapters stacked per fused matrix (A: [slots, subs * rank, in],
  B: [slots, out, rank]; for the C kernel B stored rank-major); q/k/v (gate/up) deltas
  land in their column ranges.
- ``delta``: shrink then expand over the per-token slot index (torch, C and Triton paths; the
  C path is one call per projection over the step's tokens grouped by slot).
- ``manager``: registry, host-memory LRU cache, device-slot LRU, the step's ``LoraBatch`` from
  each row's adapter (the scheduler keeps a step's distinct adapters within the slots:
  ``engine.scheduler.step_adapters``).
"""

from __future__ import annotations

from engine.lora.request import LoRARequest

__all__ = ["LoRARequest"]
