"""PeerInfo: what a reader needs to pull blocks from an owner, as text the cluster can carry.

The owner publishes it (through Redis and HTTP); the reader passes it to `read_blocks`. A new
process gets a new `incarnation`, so a reader holding a restarted peer's old PeerInfo is
refused instead of reading from state that no longer exists.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from dataclasses import asdict, dataclass, field
from dataclasses import fields as dataclass_fields
from enum import StrEnum
from typing import Any

from kv_transfer.head_plan import LayerSpan, RankKV, RankShard, parallel_sizes

_VERSION = 1  # the JSON form's own version; the protocol's is `PeerInfo.protocol`
# Release 0.1.0 (protocol 0) refuses a PeerInfo with a key it does not know, so `protocol`
# is written only from the version whose oldest peer reads it: 2. Protocol 1 reads it, and
# drops keys it does not know.
_PROTOCOL_WRITTEN_FROM = 2


def stated_protocol(version: int) -> int:
    """The protocol a PeerInfo of an owner speaking `version` states: the version from the first
    that writes it, else 0 (not stated), so that what is published reads back the same."""
    return version if version >= _PROTOCOL_WRITTEN_FROM else 0


class TransportKind(StrEnum):
    NIXL = "nixl"
    TCP = "tcp"


@dataclass(frozen=True)
class Identity:
    """Who this process is to its peers: node, incarnation and KV layout; `token` is the
    cluster token (shown by a reader, checked by an owner; never printed)."""

    node_name: str
    incarnation: str
    fingerprint: str
    layout: str
    token: str | None = field(default=None, repr=False, compare=False)

    @property
    def agent_name(self) -> str:
        return f"{self.node_name}.{self.incarnation}"


@dataclass(frozen=True)
class PeerInfo:
    """One owner process's transfer endpoint and KV region.

    agent_name: unique per process (`node_name.incarnation`). fingerprint / layout: the KV
    layout's hash and readable description. base_address, block_bytes, num_blocks, mem_type
    ("DRAM" or "VRAM"), device_id: where block `i` lives (`base_address + i * block_bytes`).
    nixl_metadata: the NIXL agent's metadata (NIXL transport). tcp_host / tcp_port: the block
    server's address (TCP transport). num_kv_heads / shards: a multi-rank owner's model KV
    heads and, per rank, the heads and layers it holds (its tensor-parallel share of its
    pipeline stage's), where its blocks live (rank 0's are the fields above) and the rank's
    own endpoint when it serves its shard from its own process (a TCP listener, or a NIXL
    agent named ``rank_agent_name``); empty on a node of one rank. protocol: the owner's
    protocol version (kv_transfer.version), in the JSON from version 2 on (0: not stated, a
    version below 2; the router pairs nodes by their records' versions, the TCP handshake
    states them).
    """

    node_name: str
    incarnation: str
    transport: TransportKind
    fingerprint: str
    layout: str
    num_blocks: int
    block_bytes: int
    mem_type: str
    device_id: int
    base_address: int
    nixl_metadata: bytes | None = None
    tcp_host: str | None = None
    tcp_port: int | None = None
    num_kv_heads: int = 0
    shards: tuple[RankShard, ...] = ()
    protocol: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "transport", TransportKind(self.transport))
        shards = tuple(s if isinstance(s, RankShard) else _rank_shard(s) for s in self.shards)
        object.__setattr__(self, "shards", shards)
        if shards and self.num_kv_heads < 1:
            raise ValueError("PeerInfo.num_kv_heads must be >= 1 with shards")
        for name in ("node_name", "incarnation", "fingerprint"):
            if not getattr(self, name):
                raise ValueError(f"PeerInfo.{name} must be a non-empty string")
        for name in ("num_blocks", "block_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"PeerInfo.{name} must be >= 1, got {getattr(self, name)}")
        if self.mem_type not in ("DRAM", "VRAM"):
            raise ValueError(f"PeerInfo.mem_type must be DRAM or VRAM, got {self.mem_type!r}")
        if self.transport is TransportKind.NIXL and not self.nixl_metadata:
            raise ValueError("PeerInfo.nixl_metadata is required for the nixl transport")
        if self.transport is TransportKind.TCP and (not self.tcp_host or not self.tcp_port):
            raise ValueError("PeerInfo.tcp_host and tcp_port are required for the tcp transport")

    @property
    def agent_name(self) -> str:
        return f"{self.node_name}.{self.incarnation}"

    @property
    def tp_size(self) -> int:
        return parallel_sizes([s.part for s in self.shards])[0] if self.shards else 1

    @property
    def pp_size(self) -> int:
        return parallel_sizes([s.part for s in self.shards])[1] if self.shards else 1

    def parts(self, num_kv_heads: int, num_layers: int) -> list[RankKV]:
        """The layers and heads of each rank (one rank holding the model's every layer and
        head when unsharded)."""
        return [s.part for s in self.rank_shards(num_kv_heads, num_layers)]

    def rank_shards(self, num_kv_heads: int, num_layers: int) -> tuple[RankShard, ...]:
        """Every rank's region (one, from the fields above, when unsharded)."""
        if self.shards:
            return self.shards
        every = LayerSpan(0, num_layers)
        return (
            RankShard(
                start=0,
                length=num_kv_heads,
                base_address=self.base_address,
                block_bytes=self.block_bytes,
                device_id=self.device_id,
                layer_start=every.start,
                num_layers=every.length,
            ),
        )

    def to_json(self) -> str:
        fields: dict[str, Any] = asdict(self)
        fields["transport"] = self.transport.value
        if self.nixl_metadata is not None:
            fields["nixl_metadata"] = base64.b64encode(self.nixl_metadata).decode("ascii")
        if not self.shards:  # a node of one rank publishes what it did before ranks existed
            del fields["shards"], fields["num_kv_heads"]
        if self.protocol < _PROTOCOL_WRITTEN_FROM:
            del fields["protocol"]
        for shard in fields.get("shards", ()):
            if not shard["tcp_port"]:  # served by the node's block server, as before
                del shard["tcp_host"], shard["tcp_port"]
            if shard["nixl_metadata"] is None:  # served by the node's agent, as before
                del shard["nixl_metadata"], shard["agent_base_address"]
            else:
                shard["nixl_metadata"] = base64.b64encode(shard["nixl_metadata"]).decode("ascii")
        return json.dumps({"v": _VERSION, **fields}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> PeerInfo:
        """Parse `to_json` output; ValueError names what is wrong."""
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"PeerInfo is not valid JSON: {exc}") from None
        if not isinstance(fields, dict) or fields.pop("v", None) != _VERSION:
            raise ValueError(f"PeerInfo must be a JSON object with v={_VERSION}")
        meta = fields.get("nixl_metadata")
        if meta is not None:
            fields["nixl_metadata"] = base64.b64decode(meta)
        for shard in fields.get("shards", ()):
            if isinstance(shard, dict) and shard.get("nixl_metadata") is not None:
                shard["nixl_metadata"] = base64.b64decode(shard["nixl_metadata"])
        try:
            return cls(**{k: v for k, v in fields.items() if k in _PEER_FIELDS})
        except TypeError as exc:
            raise ValueError(f"PeerInfo fields are wrong: {exc}") from None

    def agent_shards(self, num_kv_heads: int, num_layers: int) -> tuple[RankShard, ...]:
        """Every rank's region where the NIXL agent that serves it registered it (a rank's
        own agent: in the rank's process)."""
        return tuple(
            dataclasses.replace(s, base_address=s.agent_base_address) if s.nixl_metadata else s
            for s in self.rank_shards(num_kv_heads, num_layers)
        )

    def rank_agent(self, rank: int) -> tuple[str, bytes]:
        """(agent name, metadata) of the NIXL agent that serves rank ``rank``'s cells: the
        rank's own where it runs one, else the node's."""
        shard = self.shards[rank] if rank < len(self.shards) else None
        if shard is not None and shard.nixl_metadata:
            return rank_agent_name(self.agent_name, rank), shard.nixl_metadata
        assert self.nixl_metadata is not None
        return self.agent_name, self.nixl_metadata

    def to_bytes(self) -> bytes:
        return self.to_json().encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> PeerInfo:
        return cls.from_json(data)


def rank_agent_name(agent_name: str, rank: int) -> str:
    """The NIXL agent name of rank ``rank``'s own agent on the node ``agent_name``."""
    return f"{agent_name}.rank{rank}"


_SHARD_FIELDS = frozenset(f.name for f in dataclass_fields(RankShard))
_PEER_FIELDS = frozenset(f.name for f in dataclass_fields(PeerInfo))  # a newer sender's: left out


def _rank_shard(given: dict[str, Any]) -> RankShard:
    """A shard from JSON; fields a newer sender adds are left out (each names a way to
    serve the rank's cells that the node's own endpoint also serves)."""
    return RankShard(**{k: v for k, v in given.items() if k in _SHARD_FIELDS})
