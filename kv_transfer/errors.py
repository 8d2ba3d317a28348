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
            f"KV layout mismatch with peer {peer}{layout_differences(local, remote)}: "
            f"this node has [{local}], the peer has [{remote}]"
        )
        self.local = local
        self.remote = remote


def layout_differences(local: str, remote: str) -> str:
    """`` in model (a here, b there), layers (...)``: the ``key=value`` fields of two layout
    descriptions that differ, or nothing when none can be told apart."""

    def fields(text: str) -> dict[str, str]:
        return dict(part.split("=", 1) for part in text.split() if "=" in part)

    mine, theirs = fields(local), fields(remote)
    keys = [k for k in mine if k in theirs and mine[k] != theirs[k]]
    keys += [k for k in mine.keys() ^ theirs.keys()]
    if not keys:
        return ""
    named = (f"{k} ({mine.get(k, 'unset')} here, {theirs.get(k, 'unset')} there)" for k in keys)
    return " in " + ", ".join(named)


class TransferRefused(TransferError):
    """The owner refused the reader: a missing or wrong cluster token."""


class TransportUnavailable(TransferError):
    """The requested transport cannot be used in this process (e.g. NIXL is not installed)."""
