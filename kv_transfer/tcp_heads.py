"""Layer- and head-range READs over the TCP fallback, between nodes that split the KV
differently (tensor-parallel heads, pipeline-parallel layers).

reader -> owner: READ {request_id, block_ids, heads: [start, length], layers: [start,
length]} (global KV heads and layers; no ``layers``: every layer); owner -> reader: one DATA
frame of ``[blocks, layers, 2, block_size, heads, head_dim]``, each cell from the first of
the owner's ranks that holds it. The reader asks once per piece one of its ranks receives
and writes it into that rank's blocks; one RELEASE after the last.
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


def wire_spans(plan: HeadPlan) -> list[tuple[int, HeadSpan, LayerSpan]]:
    """(receiving rank, global heads, global layers) per READ: the plan's reads with
    adjacent heads of the same layers into the same rank merged (the owner picks the sending
    ranks)."""
    out: list[tuple[int, HeadSpan, LayerSpan]] = []
    for p in sorted(plan.reads, key=lambda p: (p.dst, p.layers, p.heads.start)):
        if out and out[-1][::2] == (p.dst, p.layers) and out[-1][1].stop == p.heads.start:
            last = out[-1][1]
            out[-1] = (p.dst, HeadSpan(last.start, last.length + p.heads.length), p.layers)
        else:
            out.append((p.dst, p.heads, p.layers))
    return out


class HeadRead(BlockRead):
    """One request's head-range READs on one connection (``BlockRead`` for the rest)."""

    def __init__(self, shards: KVShards, plan: HeadPlan, *args: Any) -> None:
        super().__init__(*args)
        self.shards = shards
        self.spans = wire_spans(plan)

    def nbytes(self) -> int:
        n = len(self.local_ids)
        return sum(
            self.shards.piece_bytes(heads.length, layers.length, n)
            for _, heads, layers in self.spans
        )

    def _exchange(self) -> socket.socket:
        sock = self._sock
        assert sock is not None
        for i, (rank, heads, layers) in enumerate(self.spans):
            body = {
                "request_id": self.request_id,
                "block_ids": self.remote_ids,
                "heads": [heads.start, heads.length],
                "layers": [layers.start, layers.length],
            }
            self._read_one(sock, body, first=i == 0)
            self.shards.scatter(rank, self.local_ids, heads, self._staging, layers)
        self.shards.synchronize()
        send_json(sock, Kind.RELEASE, {"request_id": self.request_id})
        return sock

    def _read_one(self, sock: socket.socket, body: dict[str, Any], *, first: bool) -> None:
        try:
            sock.settimeout(self.deadline.remaining())
            send_json(sock, Kind.READ, body)
            kind, length = recv_header(sock)
        except ConnectionError as exc:
            if first:  # nothing came back: the socket died while idle
                raise _StaleSocket() from exc
            raise
        if kind is Kind.ERROR:
            raise refusal_error(recv_json_body(sock, length), self.identity.layout, self.peer)
        heads, layers = body["heads"][1], body["layers"][1]
        expected = self.shards.piece_bytes(heads, layers, len(self.local_ids))
        if kind is not Kind.DATA or length != expected:
            raise TransferError(f"{self.peer.agent_name} sent {kind.name} of {length} bytes")
        kv = self.shards.tensors[0]
        shape = (layers, *kv.shape[2:4], heads, kv.shape[5])
        raw = torch.empty(length, dtype=torch.uint8)
        sock.settimeout(self.deadline.remaining())
        recv_into_exact(sock, raw.numpy().data)
        self._staging = raw.view(kv.dtype).view(len(self.local_ids), *shape)


def serve_heads(conn: socket.socket, body: dict[str, Any], shards: KVShards) -> str | None:
    """Answer a layer- and head-range READ; the refusal's message when the request is bad."""
    ids, heads = body.get("block_ids"), body.get("heads")
    layers = body.get("layers", [0, shards.num_layers])
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
    data = shards.gather(ids, span, held)
    payload = data.view(-1).view(torch.uint8).numpy().data
    send_data_header(conn, payload.nbytes)
    conn.sendall(payload)
    return None


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
