"""A node's LoRA adapters by name: loaded at start (``--lora-modules``), at run time (the
router's load call) or when a request names one this node lacks (from the path it carries).

Loading runs in the engine thread (``LLMEngine.add_lora``); a file that cannot be served is
a 400 naming it, and the node keeps serving.
"""

from __future__ import annotations

import itertools
import logging

from cluster.protocol import AdapterRef
from engine.engine import LLMEngine
from engine.loop.engine_loop import EngineLoop
from engine.lora.adapter import LoraLoadError
from engine.lora.request import LoRARequest
from node.errors import bad_request

log = logging.getLogger("splitserve.node.adapters")


class NodeAdapters:
    """Adapter name -> the LoRARequest the engine knows it by."""

    def __init__(self, loop: EngineLoop, enabled: bool) -> None:
        self._loop = loop
        self.enabled = enabled
        self._known: dict[str, LoRARequest] = {}
        self._ids = itertools.count(1)

    def names(self) -> list[str]:
        return sorted(self._known)

    async def load(self, name: str, path: str) -> LoRARequest:
        """Load an adapter (again, when the path changed); 400 naming the file if bad."""
        if not self.enabled:
            raise bad_request("this node serves no LoRA adapters (start it with --enable-lora)")
        known = self._known.get(name)
        if known is not None and str(known.path) == path:
            return known
        if known is not None:
            await self.unload(name)
        lora = LoRARequest(name, next(self._ids), path)
        try:
            await self._loop.call(lambda engine: engine.add_lora(lora))
        except LoraLoadError as exc:
            log.warning("lora_load_failed adapter=%s error=%s", name, exc)
            raise bad_request(str(exc), "lora_path") from None
        self._known[name] = lora
        log.info("lora_loaded adapter=%s", name)
        return lora

    async def unload(self, name: str) -> bool:
        """Forget an adapter; False when this node did not have it."""
        if self._known.pop(name, None) is None:
            return False
        await self._loop.call(lambda engine: _remove(engine, name))
        return True

    async def resolve(self, ref: AdapterRef | None) -> LoRARequest | None:
        """The adapter a request names, loaded first if this node lacks it (None: base)."""
        if ref is None:
            return None
        known = self._known.get(ref.name)
        if known is not None and str(known.path) == ref.path:
            return known
        return await self.load(ref.name, ref.path)


def _remove(engine: LLMEngine, name: str) -> bool:
    return engine.remove_lora(name)
