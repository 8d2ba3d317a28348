"""LoRA adapters as a command line names them: ``name=path`` entries (vLLM's
``--lora-modules``), declared once for the processes that load them at start (the nodes and
``splitserve generate``); the router reads the same list."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from config_kit import Helm, check_fields, setting


@dataclass(frozen=True)
class LoraModules:
    """The adapters a process loads at start; giving any turns LoRA on."""

    lora_modules: list[str] = setting(
        help="LoRA adapters (PEFT directories) loaded at start (turns --enable-lora on)",
        factory=list, metavar="NAME=PATH", helm=Helm.CHART,
    )  # fmt: skip

    def __post_init__(self) -> None:
        check_fields(self)
        lora_module_map(self.lora_modules)


def lora_module_map(modules: Sequence[str]) -> dict[str, str]:
    """`name=path` entries as {name: path}; ValueError naming a malformed or repeated one."""
    out: dict[str, str] = {}
    for entry in modules:
        name, sep, path = entry.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"lora_modules entry {entry!r} is not name=path")
        if name in out:
            raise ValueError(f"lora_modules names {name!r} twice")
        out[name] = path
    return out
