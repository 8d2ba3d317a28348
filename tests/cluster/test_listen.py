"""Sockets the launcher binds and hands to its children (cluster.listen, launcher.process)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from cluster.listen import LISTEN_FD_ENV, bound_port, listener, open_listener
from launcher.process import Child

SERVE_ONCE = """
import os, socket
sock = socket.socket(fileno=int(os.environ["SPLITSERVE_LISTEN_FD"]))
conn, _ = sock.accept()
conn.sendall(b"served by the child")
conn.close()
"""


def test_a_handed_socket_is_used_and_leaves_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handed = open_listener("127.0.0.1", 0)
    monkeypatch.setenv(LISTEN_FD_ENV, str(handed.fileno()))
    sock = listener("127.0.0.1", bound_port(handed))
    assert sock.fileno() == handed.fileno() and LISTEN_FD_ENV not in os.environ
    with socket.create_connection(("127.0.0.1", bound_port(sock)), timeout=10):
        conn, _ = sock.accept()
        conn.close()
    sock.detach()  # `handed` owns the descriptor
    handed.close()


def test_a_handed_socket_on_another_port_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    handed = open_listener("127.0.0.1", 0)
    other = open_listener("127.0.0.1", 0)
    monkeypatch.setenv(LISTEN_FD_ENV, str(os.dup(handed.fileno())))
    with pytest.raises(OSError, match=f"listens on port {bound_port(handed)}, not"):
        listener("127.0.0.1", bound_port(other))
    handed.close()
    other.close()


def test_a_bad_descriptor_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LISTEN_FD_ENV, "not-a-number")
    with pytest.raises(OSError, match="'not-a-number' is not an open socket"):
        listener("127.0.0.1", 0)


def test_without_a_handed_socket_it_binds_and_a_busy_port_fails() -> None:
    sock = listener("127.0.0.1", 0)
    with pytest.raises(OSError):
        listener("127.0.0.1", bound_port(sock))
    sock.close()


def test_a_child_serves_on_the_handed_port_and_its_exit_frees_it(tmp_path: Path) -> None:
    sock = open_listener("127.0.0.1", 0)
    port = bound_port(sock)
    child = Child(
        "server", [sys.executable, "-c", SERVE_ONCE], tmp_path / "s.log", os.environ, sock
    )
    assert sock.fileno() == -1  # the launcher's copy is closed: only the child holds the port
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.settimeout(30)
        assert conn.recv(64) == b"served by the child"
    assert child.proc.wait(timeout=30) == 0
    with pytest.raises(ConnectionRefusedError):  # nothing left listening: refused, not hung
        socket.create_connection(("127.0.0.1", port), timeout=10)
