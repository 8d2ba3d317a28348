"""Moving given blocks of a registered KV tensor between processes (NIXL, or TCP fallback),
whole or as the (layer, head) pieces that pools of different TP x PP exchange.

Knows nothing of scheduling: the engine supplies the tensor, the layout fingerprint and a
callback that frees blocks; the cluster carries PeerInfo between nodes.
"""

from kv_transfer.agent import KVTransferAgent, TransferCounters
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
from kv_transfer.transport import TransferResult

__all__ = [
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
