"""Layer- and head-range READs over the TCP fallback, between nodes that split the KV
differently (tensor-parallel heads, pipeline-parallel layers).

reader -> owner: READ {request_id, block_ids, heads: [start, length], layers: [start,
length], rank} (global KV heads and layers, the sending rank that holds them; no ``layers``:
every layer; no ``rank``: each cell from the first of the owner's ranks that holds it);
owner -> reader: one DATA frame of ``[blocks, layers, 2, block_size, heads, head_dim]``.

The pieces of each (sending rank, receiving rank) pair travel on a connection of their own,
all pairs at once:
to the rank's own listener when its PeerInfo shard names one (the rank's process serves its
own tensor), else to the node's block server (a thread per connection). A piece lands
straight in the receiving rank's blocks when it is one run there (the rank's every head, on
the host), else through a staging buffer. One RELEASE, to the node's server, after the last.
"""

from __future__ import annotations

import socket
from typing import Any, TypeGuard

import torch

from kv_transfer.errors import TransferError
from kv_transfer.head_plan import HeadPlan, HeadSpan, LayerSpan
from kv_transfer.region import check_block_ids
from kv_transfer.shards import KVShards
from kv_transfer.tcp_client import BlockRead, _StaleSocket, refusal_error
from kv_transfer.tcp_protocol import (
    Kind,
    recv_header,
    recv_into_exact,
    recv_json_body,
    send_data_header,
    send_json,
)

Span = tuple[int, HeadSpan, LayerSpan]  # (receiving rank, global heads, global layers)


def rank_spans(plan: HeadPlan) -> dict[tuple[int, int], list[Span]]:
    """Per (sending rank, receiving rank), the READs between them: the plan's reads with
    adjacent heads of the same layers merged."""
    out: dict[tuple[int, int], list[Span]] = {}
    for p in sorted(plan.reads, key=lambda p: (p.src, p.dst, p.layers, p.heads.start)):
        spans = out.setdefault((p.src, p.dst), [])
        if spans and spans[-1][::2] == (p.dst, p.layers) and spans[-1][1].stop == p.heads.start:
            last = spans[-1][1]
            spans[-1] = (p.dst, HeadSpan(last.start, last.length + p.heads.length), p.layers)
        else:
            spans.append((p.dst, p.heads, p.layers))
    return out


class RankRead(BlockRead):
    """One request's READs of pieces sending rank ``rank`` holds (for one receiving rank),
    on one connection of their own (``BlockRead`` for the rest); no RELEASE (the caller sends
    one after every rank's)."""

    def __init__(self, shards: KVShards, rank: int, spans: list[Span], *args: Any) -> None:
        super().__init__(*args)
        self.shards, self.rank, self.spans = shards, rank, spans
        self.label = f"{self.peer.agent_name} (sending rank {rank})"
        own = self.peer.shards[rank] if rank < len(self.peer.shards) else None
        if own is not None and own.tcp_port:  # the rank serves its own tensor
            self.address = (own.tcp_host or self.peer.tcp_host, own.tcp_port)
            self.key = f"{self.peer.agent_name}#{rank}"

    def nbytes(self) -> int:
        n = len(self.local_ids)
        return sum(
            self.shards.piece_bytes(heads.length, layers.length, n)
            for _, heads, layers in self.spans
        )

    def _exchange(self) -> socket.socket:
        sock = self._sock
        assert sock is not None
        for i, (dst, heads, layers) in enumerate(self.spans):
            body = {
                "request_id": self.request_id,
                "block_ids": self.remote_ids,
                "heads": [heads.start, heads.length],
                "layers": [layers.start, layers.length],
                "rank": self.rank,
            }
            if self.window.trace:
                body["trace"] = self.window.trace
            self._read_one(sock, dst, body, first=i == 0)
        self.shards.synchronize()
        return sock

    def _read_one(
        self, sock: socket.socket, dst: int, body: dict[str, Any], *, first: bool
    ) -> None:
        try:
            sock.settimeout(self.deadline.remaining())
            self.window.post()
            send_json(sock, Kind.READ, body)
            kind, length = recv_header(sock)
        except ConnectionError as exc:
            if first:  # nothing came back: the socket died while idle
                raise _StaleSocket() from exc
            raise
        if kind is Kind.ERROR:
            raise refusal_error(recv_json_body(sock, length), self.identity.layout, self.peer)
        heads, layers = HeadSpan(*body["heads"]), LayerSpan(*body["layers"])
        expected = self.shards.piece_bytes(heads.length, layers.length, len(self.local_ids))
        if kind is not Kind.DATA or length != expected:
            raise TransferError(f"{self.label} sent {kind.name} of {length} bytes")
        views = self.shards.block_views(dst, self.local_ids, heads, layers)
        if views is not None:  # straight into the receiving rank's blocks
            for view in views:
                sock.settimeout(self.deadline.remaining())
                recv_into_exact(sock, view)
            self.window.complete()
            return
        kv = self.shards.tensors[0]
        shape = (layers.length, *kv.shape[2:4], heads.length, kv.shape[5])
        raw = torch.empty(length, dtype=torch.uint8)
        sock.settimeout(self.deadline.remaining())
        recv_into_exact(sock, raw.numpy().data)
        staging = raw.view(kv.dtype).view(len(self.local_ids), *shape)
        self.shards.scatter(dst, self.local_ids, heads, staging, layers)
        self.window.complete()


def serve_heads(
    conn: socket.socket, body: dict[str, Any], shards: KVShards, first_rank: int = 0
) -> int | str:
    """Answer a layer- and head-range READ: the bytes sent, or the refusal's message when
    the request is bad.
    ``shards`` are the ranks ``first_rank`` .. of the node (a rank's own listener: its one
    tensor), each holding global layers and heads."""
    ids, heads = body.get("block_ids"), body.get("heads")
    layers, rank = body.get("layers", [0, shards.num_layers]), body.get("rank")
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        return "block_ids must be a list of integers"
    if not _is_range(heads):
        return "heads must be [start, length]"
    if not _is_range(layers):
        return "layers must be [start, length]"
    span, held = HeadSpan(*heads), LayerSpan(*layers)
    if span.start < 0 or span.length < 1 or span.stop > shards.num_kv_heads:
        return f"heads {heads} are outside the model's {shards.num_kv_heads} KV heads"
    if held.start < 0 or held.length < 1 or held.stop > shards.num_layers:
        return f"layers {layers} are outside the model's {shards.num_layers} layers"
    try:
        check_block_ids(ids, shards.tensors[0].shape[0], "block_ids", unique=False)
    except ValueError as exc:
        return str(exc)
    if rank is None and first_rank == 0:  # a reader that lets the owner pick the ranks
        return _send(conn, shards.gather(ids, span, held))
    local = rank - first_rank if isinstance(rank, int) else -1
    if not 0 <= local < shards.size or not shards.holds(local, span, held):
        return f"rank {rank} does not hold layers {layers} x heads {heads} here"
    views = shards.block_views(local, ids, span, held)
    if views is None:
        return _send(conn, shards.gather_rank(local, ids, span, held))
    nbytes = sum(v.nbytes for v in views)
    send_data_header(conn, nbytes)
    for view in views:  # straight from the rank's blocks
        conn.sendall(view)
    return nbytes


def _send(conn: socket.socket, data: torch.Tensor) -> int:
    payload = data.view(-1).view(torch.uint8).numpy().data
    send_data_header(conn, payload.nbytes)
    conn.sendall(payload)
    return int(payload.nbytes)


def _is_range(value: object) -> TypeGuard[list[int]]:
    return isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value)


def local_shards(kv: torch.Tensor, given: KVShards | None) -> KVShards:
    """The node's shards, or its one tensor seen as a single rank holding every head."""
    if given is not None:
        return given
    if kv.dim() != 6:
        raise ValueError(f"a head-range transfer needs a 6-dim KV cache, got {tuple(kv.shape)}")
    heads = int(kv.shape[4])
    return KVShards([kv], [HeadSpan(0, heads)], heads)
