"""Hosts on one machine: a network namespace per host, each with its own address on a bridge
that this module creates, and removes with everything in it.

    with HostNet.make(["router", "redis", "prefill-0"]) as net:
        net.popen("router", argv, log)      # a process "on" the router host
        net.address("router")               # its address, e.g. 10.213.7.2

The machine running this (the root namespace) holds the bridge's address, .1: the client.
Every name carries the creating process's pid (`ssc<pid>...`), so a later run removes what a
run killed with SIGKILL left behind (`sweep_stale`). Needs root and iproute2 (`ip`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from launcher.process import die_with_parent_hook

PREFIX = "ssc"  # every namespace and link this module makes starts with it
INNER_DEV = "eth0"  # a host's interface, inside its namespace
MTU = 9000  # jumbo frames, as a datacenter network has
KILL_WAIT_S = 10.0
NETNS_DIR = Path("/run/netns")  # where `ip netns add` mounts a namespace


class NetError(RuntimeError):
    """An `ip` command failed; the message holds the command and its output."""


def ip(*args: str, check: bool = True) -> str:
    """Run `ip ARGS`; its stdout. NetError naming the command when it fails and `check`."""
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here (None: they can): not root, no `ip`, or the kernel
    refuses a namespace or a bridge."""
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, as CI does)"
    if shutil.which("ip") is None:
        return "no `ip` command (install iproute2)"
    if not Path("/dev/net/tun").exists():
        return "no /dev/net/tun (the fault links need TUN devices)"
    probe = f"{PREFIX}{os.getpid()}probe"
    try:
        ip("netns", "add", probe)
        ip("link", "add", probe[:15], "type", "bridge")
    except (NetError, OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot make a network namespace and a bridge: {exc}"
    finally:
        ip("link", "del", probe[:15], check=False)
        ip("netns", "del", probe, check=False)
    return None


@dataclass
class Host:
    name: str
    netns: str
    address: str
    outer_dev: str  # its veth's end on the bridge, in the root namespace


@dataclass
class HostNet:
    """The bridge, the hosts and the processes started on them."""

    bridge: str
    gateway: str  # the bridge's own address: this machine, the client
    hosts: dict[str, Host]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # this process's children from before the hosts (another test's server): never strays
    before: frozenset[int] = field(default_factory=lambda: frozenset(_children(os.getpid())))

    @classmethod
    def make(cls, names: Sequence[str]) -> HostNet:
        """The bridge and one namespace per name; half-made ones are removed on failure."""
        sweep_stale()
        tag = f"{PREFIX}{os.getpid()}"
        subnet = _free_subnet()
        addrs = list(subnet.hosts())
        net = cls(f"{tag}br", str(addrs[0]), {})
        try:
            ip("link", "add", net.bridge, "mtu", str(MTU), "type", "bridge")
            ip("addr", "add", f"{addrs[0]}/{subnet.prefixlen}", "dev", net.bridge)
            ip("link", "set", net.bridge, "up")
            for i, name in enumerate(names):
                host = Host(name, f"{tag}-{name}", str(addrs[i + 1]), f"{tag}v{i}")
                net.hosts[name] = host
                _add_host(net.bridge, host, subnet.prefixlen)
        except BaseException:
            net.close()
            raise
        return net

    def address(self, name: str) -> str:
        return self.hosts[name].address

    def host_of(self, address: str) -> str:
        return next(h.name for h in self.hosts.values() if h.address == address)

    def popen(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """`argv` on host `name` (in `cwd`), in a session of its own, output appended to
        `log_path`; it gets SIGKILL when this process dies."""
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.hosts[name].netns, *argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=die_with_parent_hook(signal.SIGKILL),
            )
        self.procs.append(proc)
        return proc

    def pids(self, name: str) -> list[int]:
        """Every process running on host `name`."""
        return netns_pids(self.hosts[name].netns)

    def kill_host(self, name: str) -> list[int]:
        """SIGKILL every process on host `name` and reap them; the pids killed."""
        killed = kill_netns(self.hosts[name].netns)
        self.reap()
        return killed

    def reap(self) -> None:
        """Collect exited children (no zombies left)."""
        for proc in self.procs:
            proc.poll()
        self.procs = [p for p in self.procs if p.returncode is None]

    def strays(self) -> list[int]:
        """Live children of this process outside every host, started since the hosts were
        made (a fault's link left running)."""
        inside = {pid for host in self.hosts.values() for pid in netns_pids(host.netns)}
        return [pid for pid in _children(os.getpid()) if pid not in inside | self.before]

    def close(self) -> None:
        """Kill every process on every host, remove the namespaces, veths and bridge."""
        for host in self.hosts.values():
            kill_netns(host.netns)
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=KILL_WAIT_S)
        self.procs = []
        for host in self.hosts.values():
            ip("link", "del", host.outer_dev, check=False)
            ip("netns", "del", host.netns, check=False)
        ip("link", "del", self.bridge, check=False)

    def __enter__(self) -> HostNet:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _add_host(bridge: str, host: Host, prefixlen: int) -> None:
    ip("netns", "add", host.netns)
    in_ns: Callable[..., str] = lambda *a: ip("-n", host.netns, *a)  # noqa: E731
    ip("link", "add", host.outer_dev, "mtu", str(MTU), "type", "veth",
       "peer", "name", INNER_DEV, "mtu", str(MTU), "netns", host.netns)  # fmt: skip
    ip("link", "set", host.outer_dev, "master", bridge, "up")
    in_ns("addr", "add", f"{host.address}/{prefixlen}", "dev", INNER_DEV)
    in_ns("link", "set", INNER_DEV, "up")
    in_ns("link", "set", "lo", "up")


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.200.0.0/13 that no route or address of this machine overlaps."""
    used = [ipaddress.ip_network(w, strict=False) for w in _route_prefixes()]
    for _ in range(100):
        net = ipaddress.IPv4Network(f"10.{random.randint(200, 207)}.{random.randint(0, 255)}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise NetError("no free /24 in 10.200.0.0/13 for the hosts")


def _route_prefixes() -> Iterable[str]:
    for line in ip("-4", "route", "show", "table", "all").splitlines():
        first = line.split()[0] if line.split() else ""
        if first == "default" or not re.match(r"^[\d./]+$", first):
            continue
        yield first if "/" in first else f"{first}/32"


def netns_pids(netns: str) -> list[int]:
    """Every process in network namespace `netns` (what `ip netns pids` lists, without its
    failing outright when a process exits during the scan)."""
    try:
        ns = os.stat(NETNS_DIR / netns)
    except OSError:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (ns.st_dev, ns.st_ino) in _net_namespaces(entry):
            found.append(int(entry.name))
    return sorted(found)


def _net_namespaces(proc: Path) -> set[tuple[int, int]]:
    """The network namespaces of a process's threads: a zombie leader has none of its own
    while its other threads still exit (and hold its sockets)."""
    try:
        st = os.stat(proc / "ns" / "net")
        return {(st.st_dev, st.st_ino)}
    except OSError:  # gone, not ours to see, or a zombie leader
        pass
    found = set()
    with contextlib.suppress(OSError):
        for task in (proc / "task").iterdir():
            with contextlib.suppress(OSError):
                st = os.stat(task / "ns" / "net")
                found.add((st.st_dev, st.st_ino))
    return found


def kill_netns(netns: str) -> list[int]:
    """SIGKILL every process in `netns` and wait until none is left (zombies of other
    parents count as gone)."""
    deadline = time.monotonic() + KILL_WAIT_S
    killed: list[int] = []
    while pids := [p for p in netns_pids(netns) if _running(p)]:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise NetError(f"processes {pids} in {netns} survive SIGKILL")
        time.sleep(0.05)
    return sorted(set(killed))


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[1]) == parent:
            found.append(int(entry.name))
    return found


def _running(pid: int) -> bool:
    """Alive, or a zombie whose other threads still exit: SIGKILLed, a thread group's leader
    turns zombie first, and its sockets stay open (its port bound) until the last thread is
    gone, so a node started again at once could not listen."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z" or len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def sweep_stale() -> None:
    """Remove the namespaces and links of runs whose process is gone."""
    for netns in ip("netns", "list", check=False).split("\n"):
        name = netns.split(" ")[0]
        owner = _owner(name)
        if owner is not None and not _running(owner):
            kill_netns(name)
            ip("netns", "del", name, check=False)
    for line in ip("-o", "link", "show", check=False).splitlines():
        parts = line.split(":")
        name = parts[1].strip().split("@")[0] if len(parts) > 1 else ""
        owner = _owner(name)
        if owner is not None and not _running(owner):
            ip("link", "del", name, check=False)


def _owner(name: str) -> int | None:
    found = re.match(rf"^{PREFIX}(\d+)(?:br|v\d+|-.+|imp.*)$", name)
    return int(found.group(1)) if found else None
