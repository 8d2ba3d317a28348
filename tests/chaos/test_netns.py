"""The hosts of the chaos harness (bench.chaos.netns, bench.chaos.impair): network
namespaces on a bridge that talk over TCP, faults on the wire between two of them, and
nothing left behind (namespaces, links, processes), whether the block ends normally, with an
error, or the process that made them is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.chaos.impair import Impairment
from bench.chaos.netns import PREFIX, HostNet, ip, unavailable_reason

pytestmark = pytest.mark.chaos

REASON = unavailable_reason()
if REASON is not None:
    pytest.skip(f"no hosts for the chaos tests: {REASON}", allow_module_level=True)

PORT = 9100
# serves on PORT: answers each line with the same line
ECHO = (
    "import socket, sys\n"
    "s = socket.create_server((sys.argv[1], int(sys.argv[2])))\n"
    "while True:\n"
    "    c, _ = s.accept()\n"
    "    f = c.makefile('rwb', buffering=0)\n"
    "    for line in f:\n"
    "        f.write(line)\n"
    "    c.close()\n"
)
# from another host: the seconds one round trip takes, or 'timeout'
PING = (
    "import socket, sys, time\n"
    "try:\n"
    "    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5)\n"
    "    t = time.monotonic(); c.sendall(b'x\\n'); c.recv(10)\n"
    "    print(time.monotonic() - t)\n"
    "except OSError:\n"
    "    print('timeout')\n"
)


def _ours(owner: int) -> list[str]:
    """Namespaces and links named after process `owner`."""
    tag = f"{PREFIX}{owner}"
    names = ip("netns", "list").split() + ip("-o", "link", "show").replace("@", ":").split(":")
    return sorted({n.strip() for n in names if n.strip().startswith(tag)})


def _round_trip(net: HostNet, src: str, dst: str) -> str:
    argv = ["ip", "netns", "exec", net.hosts[src].netns, sys.executable, "-c", PING]
    argv += [net.address(dst), str(PORT)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    return done.stdout.strip()


def _echo_server(net: HostNet, name: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-c", ECHO, net.address(name), str(PORT)]
    proc = net.popen(name, argv, tmp_path / "echo.log")
    deadline = time.monotonic() + 20
    while _round_trip(net, "a", name) == "timeout":
        assert time.monotonic() < deadline, (tmp_path / "echo.log").read_text()
    return proc


def test_hosts_talk_over_the_bridge_and_leave_nothing(tmp_path: Path) -> None:
    with HostNet.make(["a", "b"]) as net:
        server = _echo_server(net, "b", tmp_path)
        assert net.pids("b") == [server.pid]
        assert net.address("a") != net.address("b")
        assert float(_round_trip(net, "a", "b")) < 1.0
    assert server.poll() is not None
    assert _ours(os.getpid()) == []


def test_an_error_inside_still_removes_everything(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"), HostNet.make(["a", "b"]) as net:
        server = _echo_server(net, "b", tmp_path)
        raise RuntimeError("boom")
    assert server.poll() is not None
    assert _ours(os.getpid()) == []


# listens on PORT from a thread that outlives the main one (which ends alone: SYS_exit), as
# a SIGKILLed process's leader turns zombie while its other threads still exit
HOLDER = (
    "import ctypes, socket, sys, threading, time\n"
    "s = socket.create_server((sys.argv[1], int(sys.argv[2])))\n"
    "threading.Thread(target=time.sleep, args=(600,)).start()\n"
    "print('bound', flush=True)\n"
    "ctypes.CDLL(None).syscall(60, 0)\n"
)


def test_a_killed_host_frees_its_port_for_a_process_started_at_once(tmp_path: Path) -> None:
    with HostNet.make(["a", "b"]) as net:
        argv = [sys.executable, "-c", HOLDER, net.address("b"), str(PORT)]
        holder = net.popen("b", argv, tmp_path / "holder.log")
        deadline = time.monotonic() + 20
        while _state(holder.pid) != "Z":  # the main thread ended, the listener's thread not
            assert time.monotonic() < deadline, (tmp_path / "holder.log").read_text()
            time.sleep(0.05)
        net.kill_host("b")
        _echo_server(net, "b", tmp_path)  # listens on the same port


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_partition_drops_and_a_delay_holds_frames(tmp_path: Path) -> None:
    with HostNet.make(["a", "b"]) as net:
        _echo_server(net, "b", tmp_path)
        with Impairment(net, {"a": ["b"], "b": ["a"]}, loss=1.0):
            assert _round_trip(net, "a", "b") == "timeout"
        assert float(_round_trip(net, "a", "b")) < 1.0
        with Impairment(net, {"a": ["b"]}, delay_ms=50):
            assert float(_round_trip(net, "a", "b")) >= 0.05
        assert net.strays() == []  # the link process is gone
    assert _ours(os.getpid()) == []


def test_what_a_killed_run_left_is_swept(tmp_path: Path) -> None:
    """A run SIGKILLed with its hosts up leaves them; the next run's start removes them."""
    script = (
        "import os, signal, sys\n"
        "from bench.chaos.netns import HostNet\n"
        "net = HostNet.make(['a'])\n"
        "net.popen('a', [sys.executable, '-c', 'import time; time.sleep(600)'], "
        f"__import__('pathlib').Path({str(tmp_path / 'sleep.log')!r}))\n"
        "print(os.getpid(), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL, done.stderr
    dead = int(done.stdout.split()[0])
    assert _ours(dead) != []
    with HostNet.make(["a"]):
        assert _ours(dead) == []
