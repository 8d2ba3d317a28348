"""The engine's adapters: a host-memory LRU cache of parsed adapters, the device slots (LRU
among those the step does not use), and the step's per-token slot index.

The scheduler keeps the distinct adapters of a step within the slot count
(``engine.scheduler.step_adapters``), so a step always finds its adapters a slot. A step is
given as each row's adapter: decodes (one token each), then prefill chunks (their tokens).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from engine.cpu_kernels.lora import CpuPlan
from engine.lora.adapter import LoraAdapter, LoraLoadError, load_adapter
from engine.lora.delta import LoraBatch, PackedLora, StepLora
from engine.lora.request import LoRARequest
from engine.lora.slots import LoraSlots
from engine.model.config import ModelConfig
from engine.model.decoder import DecoderModel


@dataclass
class LoraStats:
    """Totals since start (the nodes export them as metrics)."""

    loads: int = 0  # adapters read from disk into the host cache
    host_evictions: int = 0
    slot_loads: int = 0  # adapters copied into a device slot
    slot_evictions: int = 0  # a slot's adapter replaced by another
    requests: dict[str, int] = field(default_factory=dict)  # by adapter name
    tokens: dict[str, int] = field(default_factory=dict)  # computed tokens, by adapter name

    def flat(self) -> dict[str, float]:
        """The totals as one mapping: ``lora_<total>``, ``lora_requests:<adapter>`` and
        ``lora_tokens:<adapter>`` (a copy, for other threads)."""
        out: dict[str, float] = {
            "lora_loads": self.loads,
            "lora_host_evictions": self.host_evictions,
            "lora_slot_loads": self.slot_loads,
            "lora_slot_evictions": self.slot_evictions,
        }
        out.update({f"lora_requests:{k}": v for k, v in self.requests.items()})
        out.update({f"lora_tokens:{k}": v for k, v in self.tokens.items()})
        return out


class LoraManager:
    """Adapters of one engine: registered, cached on the host, loaded in device slots."""

    def __init__(
        self,
        model: DecoderModel,
        config: ModelConfig,
        max_loras: int,
        max_rank: int,
        max_cpu_loras: int,
        kernel: str,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.max_rank = max_rank
        self.max_cpu_loras = max_cpu_loras
        self.slots = LoraSlots(config, max_loras, max_rank, dtype, device, kernel == "cpu")
        self.step = StepLora(kernel)
        self.stats = LoraStats()
        self._device = device
        self._host: OrderedDict[str, LoraAdapter] = OrderedDict()  # oldest first
        self._registered: dict[str, LoRARequest] = {}
        self._slot_of: OrderedDict[str, int] = OrderedDict()  # oldest use first
        self._free = list(range(max_loras - 1, -1, -1))
        # the latest step of decodes only: its rows' adapters and batch
        self._last: tuple[tuple[LoRARequest | None, ...], LoraBatch | None] | None = None
        for layer, matrices in zip(model.decoder_layers(), self.slots.layers, strict=True):
            attn = {k: v for k, v in matrices.items() if k in layer.attn.MATRICES}
            layer.attn.lora = PackedLora(attn, self.step)
            if layer.mlp is not None:
                mlp = {k: v for k, v in matrices.items() if k in layer.mlp.MATRICES}
                layer.mlp.lora = PackedLora(mlp, self.step)

    # ---- adapters -------------------------------------------------------------------------

    def add(self, lora: LoRARequest) -> None:
        """Register an adapter, read and checked now (LoraLoadError naming the file)."""
        known = self._registered.get(lora.lora_name)
        if known is not None and known.path != lora.path:
            raise LoraLoadError(
                f"adapter {lora.lora_name!r} is already loaded from {known.path}, not {lora.path}"
            )
        self._adapter(lora)
        self._registered[lora.lora_name] = lora

    def remove(self, name: str) -> bool:
        """Forget an adapter (its slot freed); False when unknown. Requests already running
        under it keep their LoRARequest and load it again if they need to."""
        found = self._registered.pop(name, None) is not None
        self._host.pop(name, None)
        slot = self._slot_of.pop(name, None)
        if slot is not None:
            self._free.append(slot)
            self._last = None
        return found

    def registered(self) -> list[LoRARequest]:
        return list(self._registered.values())

    def _adapter(self, lora: LoRARequest) -> LoraAdapter:
        adapter = self._host.get(lora.lora_name)
        if adapter is not None and adapter.path == lora.path:
            self._host.move_to_end(lora.lora_name)
            return adapter
        adapter = load_adapter(lora.lora_name, lora.path, self.max_rank)
        self.slots.check(adapter)
        self.stats.loads += 1
        self._host[lora.lora_name] = adapter
        while len(self._host) > self.max_cpu_loras:
            self._host.popitem(last=False)
            self.stats.host_evictions += 1
        return adapter

    # ---- the step -------------------------------------------------------------------------

    def prepare(
        self,
        decodes: Sequence[LoRARequest | None],
        prefills: Sequence[LoRARequest | None] = (),
        prefill_tokens: Sequence[int] = (),
    ) -> LoraBatch | None:
        """The step's slot index (adapters loaded into slots first) from the adapter of each
        decode row (one token each), then of each prefill chunk (``prefill_tokens`` each);
        None: no token of the step runs under an adapter."""
        if not prefills and self._last is not None and self._last[0] == tuple(decodes):
            batch = self._last[1]  # steady decoding: same rows, same slots
            if batch is not None:
                self._count(decodes, prefills, prefill_tokens)
            return batch
        loras = [*decodes, *prefills]
        counts = [1] * len(decodes) + list(prefill_tokens)
        batch = self._batch(loras, counts)
        self._last = (tuple(decodes), batch) if not prefills else None
        if batch is not None:
            self._count(decodes, prefills, prefill_tokens)
        return batch

    def bind(self, batch: LoraBatch | None) -> None:
        """The batch every layer reads in the next forward."""
        self.step.batch = batch

    def _batch(
        self, loras: Sequence[LoRARequest | None], counts: Sequence[int]
    ) -> LoraBatch | None:
        wanted = {lora.lora_name: lora for lora in loras if lora is not None}
        if not wanted:
            return None
        if len(wanted) > self.slots.num_slots:
            raise RuntimeError(
                f"a step names {len(wanted)} adapters, max_loras is {self.slots.num_slots}"
            )
        slot_of = {name: self._acquire(lora, wanted) for name, lora in wanted.items()}
        per_row = [slot_of[lora.lora_name] if lora is not None else -1 for lora in loras]
        token_slots = torch.tensor(per_row, dtype=torch.int64).repeat_interleave(
            torch.tensor(counts)
        )  # [tokens]
        if self._device.type != "cpu":
            token_slots = token_slots.pin_memory().to(self._device, non_blocking=True)
        plan = CpuPlan(token_slots, self.slots.max_rows) if self.step.kernel == "cpu" else None
        return LoraBatch(token_slots, tuple(sorted(set(slot_of.values()))), plan)

    def _acquire(self, lora: LoRARequest, step: dict[str, LoRARequest]) -> int:
        """The adapter's slot, loaded into a free one or the least recently used one that
        the step does not use."""
        name = lora.lora_name
        slot = self._slot_of.get(name)
        if slot is not None:
            self._slot_of.move_to_end(name)
            return slot
        if self._free:
            slot = self._free.pop()
        else:
            victim = next(n for n in self._slot_of if n not in step)
            slot = self._slot_of.pop(victim)
            self.stats.slot_evictions += 1
        self.slots.fill(slot, self._adapter(lora))
        self.stats.slot_loads += 1
        self._slot_of[name] = slot
        return slot

    def _count(
        self,
        decodes: Sequence[LoRARequest | None],
        prefills: Sequence[LoRARequest | None],
        prefill_tokens: Sequence[int],
    ) -> None:
        tokens = self.stats.tokens
        for lora in decodes:
            if lora is not None:
                tokens[lora.lora_name] = tokens.get(lora.lora_name, 0) + 1
        for lora, n in zip(prefills, prefill_tokens, strict=True):
            if lora is not None:
                tokens[lora.lora_name] = tokens.get(lora.lora_name, 0) + n
