"""The interface both transports implement, and the result of one READ."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from kv_transfer.deadline import Deadline
from kv_transfer.head_plan import HeadPlan
from kv_transfer.peer_info import PeerInfo, TransportKind

if TYPE_CHECKING:
    from kv_transfer.shards import KVShards

RELEASE_PREFIX = b"splitserve-release:"


class TransferResult(NamedTuple):
    """What one READ moved and how long it took (call to completion, connect included)."""

    nbytes: int
    seconds: float

    @property
    def gbps(self) -> float:
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


class Transport(Protocol):
    """Moves blocks of a registered KV region between processes.

    Validation (ids, layouts) happens before a transport is called. Owner side: readers'
    release notices are queued by the transport and collected with `take_releases`.
    """

    kind: TransportKind

    def describe(self) -> str:
        """One line for the log: the transport and its settings."""
        ...

    def peer_fields(self) -> dict[str, object]:
        """Transport-specific PeerInfo fields (NIXL metadata or TCP address)."""
        ...

    async def read(
        self,
        peer: PeerInfo,
        remote_ids: Sequence[int],
        local_ids: Sequence[int],
        request_id: str,
        deadline: Deadline,
    ) -> int:
        """Copy the peer's `remote_ids` blocks into local `local_ids`, then tell the owner
        that `request_id` is done with them. Returns bytes moved; raises TransferError."""
        ...

    async def read_heads(
        self,
        peer: PeerInfo,
        plan: HeadPlan,
        local: KVShards,
        ids: tuple[Sequence[int], Sequence[int]],
        request_id: str,
        deadline: Deadline,
    ) -> int:
        """Like `read` for nodes that split the KV heads differently: each of `plan`'s reads
        moves its heads of the peer's blocks `ids[0]` into `local`'s rank's blocks `ids[1]`
        (the local copies of replicated heads are the caller's). Returns bytes moved."""
        ...

    async def release(self, peer: PeerInfo, request_id: str, deadline: Deadline) -> None:
        """Tell the owner that `request_id` is done with its blocks without reading any
        (the reader had them all cached). Raises TransferError."""
        ...

    async def connect(self, peer: PeerInfo, deadline: Deadline) -> None:
        """Open and cache the connection to `peer` now; raises TransferError."""
        ...

    def take_releases(self) -> list[str]:
        """Request ids that readers released since the last call (owner side)."""
        ...

    def forget(self, node_name: str) -> None:
        """Drop any cached connection to `node_name`."""
        ...

    def inflight(self) -> int:
        """READs of this process under way now."""
        ...

    def close(self) -> None: ...


def release_message(request_id: str) -> bytes:
    return RELEASE_PREFIX + request_id.encode()


def parse_release(message: bytes) -> str | None:
    """The request id of a release notice, or None for any other message."""
    if not message.startswith(RELEASE_PREFIX):
        return None
    return message[len(RELEASE_PREFIX) :].decode(errors="replace")
