"""What a request names to run under an adapter (vLLM's ``LoRARequest``). Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from models.block_hash import adapter_hash_root


@dataclass(frozen=True)
class LoRARequest:
    """An adapter: ``lora_name`` identifies it (prefix cache, KV transfer, the API's
    ``model``), ``lora_int_id`` (>= 1) is its number in this process, ``lora_path`` its PEFT
    directory."""

    lora_name: str
    lora_int_id: int
    lora_path: str | Path

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(
                f"LoRARequest.lora_name must be a non-empty string, got {self.lora_name!r}"
            )
        if not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(
                f"LoRARequest.lora_int_id must be an integer >= 1, got {self.lora_int_id!r}"
            )
        object.__setattr__(self, "lora_path", Path(self.lora_path))

    @property
    def path(self) -> Path:
        return Path(self.lora_path)

    @cached_property
    def hash_root(self) -> int:
        """The parent hash of the first KV block of a request under this adapter."""
        return adapter_hash_root(self.lora_name)
