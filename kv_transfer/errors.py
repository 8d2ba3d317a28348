"""Typed failures of a KV block transfer. Every failure a caller can see is a TransferError.

After `read_blocks` raises, nothing writes into the local blocks any more: the caller may free
or reuse them at once. Their content is undefined.
"""

from __future__ import annotations


class TransferError(Exception):
    """A transfer did not complete; the local blocks hold undefined data."""


class TransferTimeout(TransferError):
    """The transfer did not finish before its deadline."""


class TransferCancelled(TransferError):
    """The caller gave up on the transfer (its task was cancelled)."""


class PeerUnavailable(TransferError):
    """The peer cannot be reached, died, or restarted since its PeerInfo was published."""


class LayoutMismatch(TransferError):
    """The two sides' KV layouts differ; the message names both."""

    def __init__(self, local: str, remote: str, peer: str) -> None:
        super().__init__(
            f"KV layout mismatch with peer {peer}: this node has [{local}], the peer has [{remote}]"
        )
        self.local = local
        self.remote = remote


class TransferRefused(TransferError):
    """The owner refused the reader: a missing or wrong cluster token."""


class TransportUnavailable(TransferError):
    """The requested transport cannot be used in this process (e.g. NIXL is not installed)."""
