"""Where the prompt KV of an n > 1 request lies, for the sibling samples to start beside it."""

from __future__ import annotations

import asyncio


class SharedPrompt:
    """Settled once: with the decode node whose prefix cache holds the prompt's full blocks
    (sample 0 put them there), or with None when sample 0 ended without leaving them."""

    def __init__(self) -> None:
        self._settled = asyncio.Event()
        self._node_id: str | None = None

    @property
    def settled(self) -> bool:
        return self._settled.is_set()

    def settle(self, node_id: str | None) -> None:
        """The first call decides; later ones change nothing."""
        if not self._settled.is_set():
            self._node_id = node_id
            self._settled.set()

    async def node_id(self) -> str | None:
        """Wait until settled; the node to start beside, or None."""
        await self._settled.wait()
        return self._node_id
