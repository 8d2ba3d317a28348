"""Faults on the wire between hosts of a HostNet: drop, delay or lose the frames one host
sends to others, while every other path stays as it was.

    with Impairment(net, {"prefill-0": ["decode-0"]}, loss=1.0):   # a one-way partition
        ...

An impairment redirects (tc clsact + u32 + mirred) the IPv4 frames each source host sends
to its chosen destinations into a TAP device of a `bench.chaos.link` process, which drops,
delays and forwards them. Leaving the block removes the filters first, then stops the link.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from types import TracebackType

from bench.chaos.netns import MTU, HostNet, NetError
from launcher.process import die_with_parent_hook

READY_TIMEOUT_S = 10.0


def tc(*args: str, check: bool = True) -> None:
    proc = subprocess.run(["tc", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetError(f"tc {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")


class Impairment:
    """Frames from each source host to its destinations: lost with probability `loss` (1: all,
    a partition), the rest delayed `delay_ms`."""

    _count = 0

    def __init__(
        self,
        net: HostNet,
        paths: Mapping[str, Sequence[str]],
        *,
        loss: float = 0.0,
        delay_ms: float = 0.0,
    ) -> None:
        Impairment._count += 1
        self.net = net
        self.paths = {src: list(dsts) for src, dsts in paths.items()}
        self.tap = f"{net.bridge.removesuffix('br')}imp{Impairment._count}"[:15]
        self.loss = loss
        self.delay_ms = delay_ms
        self._proc: subprocess.Popen[str] | None = None
        self._filtered: list[str] = []

    def start(self) -> Impairment:
        dsts = {d for ds in self.paths.values() for d in ds}
        routes = [f"{self.net.address(d)}={self.net.hosts[d].outer_dev}" for d in sorted(dsts)]
        argv = [sys.executable, "-m", "bench.chaos.link", "--tap", self.tap, "--mtu", str(MTU)]
        argv += ["--loss", str(self.loss), "--delay-ms", str(self.delay_ms)]
        argv += [x for r in routes for x in ("--route", r)]
        self._proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent_hook()
        )
        try:
            self._wait_ready()
            for src, dsts_of_src in self.paths.items():
                self._redirect(src, dsts_of_src)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        line = self._proc.stdout.readline()  # the link prints `ready`, or exits
        if line.strip() != "ready":
            raise NetError(f"bench.chaos.link did not start (exit {self._proc.poll()})")

    def _redirect(self, src: str, dsts: Sequence[str]) -> None:
        dev = self.net.hosts[src].outer_dev
        tc("qdisc", "add", "dev", dev, "clsact")
        self._filtered.append(dev)
        for dst in dsts:
            tc("filter", "add", "dev", dev, "ingress", "protocol", "ip", "prio", "1", "u32",
               "match", "ip", "dst", f"{self.net.address(dst)}/32",
               "action", "mirred", "egress", "redirect", "dev", self.tap)  # fmt: skip

    def stop(self) -> str:
        """Filters off, link stopped; the link's last line (frames passed and dropped)."""
        for dev in self._filtered:
            tc("qdisc", "del", "dev", dev, "clsact", check=False)
        self._filtered = []
        proc, self._proc = self._proc, None
        if proc is None:
            return ""
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
        return out.strip().splitlines()[-1] if out.strip() else ""

    def __enter__(self) -> Impairment:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
