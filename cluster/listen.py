"""Listening sockets that `splitserve up` binds and hands to the processes it starts.

A port chosen by one process and bound later by another can be taken in between (by any
outgoing connection on the machine, which draws from the same ephemeral range). So the
launcher binds each child's port itself, passes the open socket down (its descriptor number
in SPLITSERVE_LISTEN_FD) and closes its own copy: the port is never free between the choice
and the child serving on it, and a child that exits frees it.
"""

from __future__ import annotations

import os
import socket

LISTEN_FD_ENV = "SPLITSERVE_LISTEN_FD"
BACKLOG = 2048


def open_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: one the kernel picks)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def bound_port(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


def listener(host: str, port: int) -> socket.socket:
    """The socket this process was handed in SPLITSERVE_LISTEN_FD (taken out of the
    environment, so no grandchild sees it), else a new one on host:port. A handed socket
    on another port than `port` is an error (OSError), not something to serve on quietly."""
    raw = os.environ.pop(LISTEN_FD_ENV, None)
    if raw is None:
        return open_listener(host, port)
    try:
        sock = socket.socket(fileno=int(raw))
    except (ValueError, OSError) as exc:
        raise OSError(f"{LISTEN_FD_ENV}={raw!r} is not an open socket: {exc}") from exc
    if port not in (0, bound_port(sock)):
        found = bound_port(sock)
        sock.close()
        raise OSError(f"the socket handed in {LISTEN_FD_ENV} listens on port {found}, not {port}")
    return sock


def handed_env(env: dict[str, str], sock: socket.socket | None) -> dict[str, str]:
    """`env` for a child that is handed `sock` (unchanged without one)."""
    return env if sock is None else dict(env, **{LISTEN_FD_ENV: str(sock.fileno())})
