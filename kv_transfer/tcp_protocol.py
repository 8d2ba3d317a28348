"""Framing of the TCP fallback: a fixed header, then a JSON body or raw block bytes.

header: magic b"SSKV", kind (1 byte), body length (8 bytes, big endian).
reader -> owner: HELLO {agent, fingerprint, layout, expect, protocol, token}, then READ
{request_id, block_ids} and RELEASE {request_id}. owner -> reader: WELCOME {agent, protocol}
or ERROR {code, message}, and for each READ one DATA frame whose body is the blocks' bytes in
the order asked. `protocol`: the sender's version (kv_transfer.version; absent: 0).
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
from enum import IntEnum
from typing import Any

MAGIC = b"SSKV"
HEADER = struct.Struct("!4sBQ")
MAX_JSON_BYTES = 16 << 20


class Kind(IntEnum):
    HELLO = 1
    WELCOME = 2
    READ = 3
    DATA = 4
    RELEASE = 5
    ERROR = 6


class ProtocolError(ConnectionError):
    """The other side sent something that is not this protocol."""


def send_json(sock: socket.socket, kind: Kind, body: dict[str, Any]) -> None:
    data = json.dumps(body, separators=(",", ":")).encode()
    sock.sendall(HEADER.pack(MAGIC, kind, len(data)) + data)


def send_data_header(sock: socket.socket, nbytes: int) -> None:
    sock.sendall(HEADER.pack(MAGIC, Kind.DATA, nbytes))


def recv_header(sock: socket.socket) -> tuple[Kind, int]:
    magic, kind, length = HEADER.unpack(recv_exact(sock, HEADER.size))
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {magic!r}")
    try:
        return Kind(kind), length
    except ValueError:
        raise ProtocolError(f"unknown message kind {kind}") from None


def recv_json_body(sock: socket.socket, length: int) -> dict[str, Any]:
    if length > MAX_JSON_BYTES:
        raise ProtocolError(f"message of {length} bytes is too large")
    body = json.loads(recv_exact(sock, length))
    if not isinstance(body, dict):
        raise ProtocolError("message body is not a JSON object")
    return body


def recv_json(sock: socket.socket) -> tuple[Kind, dict[str, Any]]:
    kind, length = recv_header(sock)
    if kind is Kind.DATA:
        raise ProtocolError("unexpected DATA frame")
    return kind, recv_json_body(sock, length)


def recv_exact(sock: socket.socket, nbytes: int) -> bytes:
    buf = bytearray(nbytes)
    recv_into_exact(sock, memoryview(buf))
    return bytes(buf)


def recv_into_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill `view` from the socket; ConnectionError if the peer closes first."""
    got, total = 0, view.nbytes
    while got < total:
        n = sock.recv_into(view[got:], total - got)
        if n == 0:
            raise ConnectionError("connection closed by peer")
        got += n


def shutdown_quietly(sock: socket.socket) -> None:
    """Unblock any thread waiting on `sock`; ignore a socket that is already gone."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
