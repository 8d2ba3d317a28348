"""Moving given blocks of a registered KV tensor between processes (NIXL, or TCP fallback),
whole or as the (layer, head) pieces that pools of different TP x PP exchange.

Knows nothing of scheduling: the engine supplies the tensor, the layout fingerprint and a
callback that frees blocks; the cluster carries PeerInfo between nodes.

`from kv_transfer import KVTransferAgent`. Names load lazily, so that importing one module
(kv_transfer.config, whose declarations the launcher reads) does not load torch or NIXL.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kv_transfer.agent import KVTransferAgent
    from kv_transfer.config import TransferConfig
    from kv_transfer.errors import (
        LayoutMismatch,
        PeerUnavailable,
        TransferCancelled,
        TransferError,
        TransferRefused,
        TransferTimeout,
        TransportUnavailable,
    )
    from kv_transfer.lease import Lease, LeaseCounts, LeaseTable
    from kv_transfer.nixl_loader import nixl_available
    from kv_transfer.peer_info import PeerInfo, TransportKind
    from kv_transfer.transport import Facts, TransferCounters, TransferResult

_EXPORTS = {
    "Facts": "kv_transfer.transport",
    "KVTransferAgent": "kv_transfer.agent",
    "LayoutMismatch": "kv_transfer.errors",
    "Lease": "kv_transfer.lease",
    "LeaseCounts": "kv_transfer.lease",
    "LeaseTable": "kv_transfer.lease",
    "PeerInfo": "kv_transfer.peer_info",
    "PeerUnavailable": "kv_transfer.errors",
    "TransferCancelled": "kv_transfer.errors",
    "TransferConfig": "kv_transfer.config",
    "TransferCounters": "kv_transfer.transport",
    "TransferError": "kv_transfer.errors",
    "TransferRefused": "kv_transfer.errors",
    "TransferResult": "kv_transfer.transport",
    "TransferTimeout": "kv_transfer.errors",
    "TransportKind": "kv_transfer.peer_info",
    "TransportUnavailable": "kv_transfer.errors",
    "nixl_available": "kv_transfer.nixl_loader",
}

__all__ = [
    "Facts",
    "KVTransferAgent",
    "LayoutMismatch",
    "Lease",
    "LeaseCounts",
    "LeaseTable",
    "PeerInfo",
    "PeerUnavailable",
    "TransferCancelled",
    "TransferConfig",
    "TransferCounters",
    "TransferError",
    "TransferRefused",
    "TransferResult",
    "TransferTimeout",
    "TransportKind",
    "TransportUnavailable",
    "nixl_available",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kv_transfer' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
