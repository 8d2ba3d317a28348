"""The protocol version of the KV handshake: cluster.protocol.PROTOCOL_VERSION, held here too
since kv_transfer imports nothing of the project (a test keeps the two equal).

A HELLO or WELCOME without `protocol` comes from version 0 (release 0.1.0). An owner serves a
reader at most one version apart and refuses one further apart with the ERROR code
`protocol`; a reader refuses such an owner's WELCOME the same way.
"""

from __future__ import annotations

PROTOCOL_VERSION = 1


def compatible(a: int, b: int) -> bool:
    """Whether peers of protocol versions `a` and `b` work together: at most one apart."""
    return abs(a - b) <= 1


def peer_version(body: dict[str, object]) -> int | None:
    """The `protocol` a HELLO or WELCOME states (0 when absent); None when it is no version."""
    version = body.get("protocol", 0)
    return (
        version
        if isinstance(version, int) and not isinstance(version, bool) and version >= 0
        else None
    )


def mismatch(theirs: int | None, ours: int) -> str | None:
    """Why a peer of version `theirs` cannot be served, or None when it can."""
    if theirs is None:
        return "the peer's protocol version is not a non-negative integer"
    if compatible(theirs, ours):
        return None
    return f"protocol version {theirs} is more than one version from this node's {ours}"
