"""LoRA adapters as a command line names them: ``name=path`` entries (vLLM's
``--lora-modules``), shared by the nodes, the router and ``splitserve generate``."""

from __future__ import annotations

from collections.abc import Sequence


def lora_module_map(modules: Sequence[str], enable_lora: bool = True) -> dict[str, str]:
    """`name=path` entries as {name: path}; ValueError naming a malformed or repeated one,
    or entries given while LoRA is off."""
    if modules and not enable_lora:
        raise ValueError("lora_modules needs enable_lora")
    out: dict[str, str] = {}
    for entry in modules:
        name, sep, path = entry.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"lora_modules entry {entry!r} is not name=path")
        if name in out:
            raise ValueError(f"lora_modules names {name!r} twice")
        out[name] = path
    return out
