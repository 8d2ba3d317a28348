"""A faulty stretch of cable, in user space: `python -m bench.chaos.link --tap NAME ...`.

This kernel may lack `sch_netem` (and iptables), so the harness impairs traffic itself: tc
filters on a host's bridge port redirect the IPv4 frames it sends to chosen peers into a TAP
device that this process owns (bench.chaos.impair). Each frame is dropped with probability
`--loss` (1: a partition), else held `--delay-ms` and sent on to the destination host's
bridge port (a packet socket), which hands it to that host. Frames to other addresses pass
untouched by tc. It prints `ready` once the TAP is up and runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import collections
import fcntl
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import time

_TUNSETIFF = 0x400454CA
_IFF_TAP = 0x0002
_IFF_NO_PI = 0x1000
_ETH_P_IP = 0x0800
_MAX_FRAME = 65536


def open_tap(name: str, mtu: int) -> int:
    """A new TAP device `name`, up; its fd. It disappears when this process exits."""
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TAP | _IFF_NO_PI))
    subprocess.run(["ip", "link", "set", name, "mtu", str(mtu), "up"], check=True)
    return fd


def dst_ip(frame: bytes) -> str | None:
    """The IPv4 destination of an Ethernet frame (None for anything else)."""
    if len(frame) < 34 or struct.unpack_from("!H", frame, 12)[0] != _ETH_P_IP:
        return None
    return socket.inet_ntoa(frame[30:34])


class Line:
    """Frames in flight: dropped at random or released after the delay, in order."""

    def __init__(self, delay_s: float, loss: float, routes: dict[str, str]) -> None:
        self.delay_s = delay_s
        self.loss = loss
        self._out = {ip: self._socket(dev) for ip, dev in routes.items()}
        self._queue: collections.deque[tuple[float, socket.socket, bytes]] = collections.deque()
        self.passed = self.dropped = 0  # dropped: by `loss`
        self.unroutable = self.failed = 0  # no route for the address; the send failed

    @staticmethod
    def _socket(dev: str) -> socket.socket:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        sock.bind((dev, 0))
        return sock

    def take(self, frame: bytes) -> None:
        dst = dst_ip(frame)
        if dst is None:  # the TAP's own IPv6 chatter: tc sends only IPv4 here
            return
        out = self._out.get(dst)
        if out is None:
            self.unroutable += 1
            return
        if random.random() < self.loss:
            self.dropped += 1
            return
        self._queue.append((time.monotonic() + self.delay_s, out, frame))

    def release(self) -> float | None:
        """Send every frame that is due; seconds until the next one (None: none held)."""
        now = time.monotonic()
        while self._queue and self._queue[0][0] <= now:
            _, out, frame = self._queue.popleft()
            try:
                out.send(frame)
                self.passed += 1
            except OSError:  # the destination's port went away: the frame is lost
                self.failed += 1
        return max(self._queue[0][0] - now, 0.0) if self._queue else None


def serve(fd: int, line: Line, stop: list[bool]) -> None:
    while not stop[0]:
        wait = line.release()
        ready, _, _ = select.select([fd], [], [], 0.2 if wait is None else wait)
        if ready:
            line.take(os.read(fd, _MAX_FRAME))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chaos.link", description=__doc__, allow_abbrev=False
    )
    parser.add_argument("--tap", required=True, help="name of the TAP device to create")
    parser.add_argument("--mtu", type=int, default=9000)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--loss", type=float, default=0.0, help="share of frames dropped")
    parser.add_argument(
        "--route", action="append", default=[], metavar="IP=DEV",
        help="a destination address and the bridge port its host is behind",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not 0.0 <= args.loss <= 1.0 or args.delay_ms < 0:
        parser.error(f"--loss must be in [0, 1] and --delay-ms >= 0: {args.loss}, {args.delay_ms}")
    routes = dict(r.split("=", 1) for r in args.route)
    fd = open_tap(args.tap, args.mtu)
    line = Line(args.delay_ms / 1000, args.loss, routes)
    stop = [False]
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.__setitem__(0, True))
    print("ready", flush=True)
    serve(fd, line, stop)
    print(
        f"passed={line.passed} dropped={line.dropped} unroutable={line.unroutable} "
        f"failed={line.failed}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
