"""The KV lease of one request: the prefill node pinning its blocks, and who must end it."""

from __future__ import annotations

from cluster.node_records import NodeInfo
from cluster.protocol import PrefillResponse
from router.state import RouterState


class KVLease:
    """Blocks a prefill node pinned for one request. The router holds the lease from the
    prefill's answer until a decode node takes the KV handle; one nobody took is released
    (a best-effort call: the lease expires anyway)."""

    def __init__(self, state: RouterState, request_id: str) -> None:
        self._s = state
        self._request_id = request_id
        self._node: NodeInfo | None = None  # the prefill node that answered
        self._held = False  # by the router: no decode node took the handle yet

    def granted(self, node: NodeInfo, answer: PrefillResponse) -> None:
        """The prefill on `node` answered; a request that went on past token 1 holds a lease."""
        self._node = node
        self._held = answer.kv is not None and not answer.finished

    def taken(self) -> None:
        """A decode node accepted the handle: ending the lease is its job now."""
        self._held = False

    def release(self) -> None:
        """Release the lease if nobody took it."""
        if self._held and self._node is not None:
            self._held = False
            self._release_on(self._node)

    def release_after_failed_import(self) -> None:
        """The decode node that took the handle failed and may not have pulled the blocks:
        free them now, not at expiry."""
        if self._node is not None:
            self._release_on(self._node)

    def release_unanswered(self, node: NodeInfo) -> None:
        """A prefill on `node` that never answered may still pin blocks there."""
        self._release_on(node)

    def _release_on(self, node: NodeInfo) -> None:
        self._s.spawn(self._s.require_nodes().release(node, self._request_id))
