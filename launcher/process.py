"""Child processes that never outlive their parent: what `splitserve up` starts.

Each child runs in its own session (so a terminal's Ctrl-C reaches only the launcher, which
stops the children in order), writes stdout and stderr to a log file, and asks the kernel
for SIGTERM when its parent dies (PR_SET_PDEATHSIG, Linux), so even a launcher killed with
SIGKILL leaves no orphan behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from cluster.listen import handed_env

_PR_SET_PDEATHSIG = 1


def die_with_parent_hook(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child receive `sig` when this process dies (Linux only;
    None elsewhere). A child whose parent is already gone exits at once."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def hook() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return hook


class Child:
    """One child process with a name and a log file. A `listener` (cluster.listen) is handed
    to the child, which serves on it, and closed here once the child holds it."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str],
        listener: socket.socket | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        try:
            with open(log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=handed_env(dict(env), listener),
                    start_new_session=True,
                    preexec_fn=die_with_parent_hook(),
                    pass_fds=() if listener is None else (listener.fileno(),),
                )
        finally:
            if listener is not None:
                listener.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exit_code(self) -> int | None:
        """None while it runs."""
        return self.proc.poll()

    def signal(self, sig: int) -> None:
        """Send `sig` to the child's whole process group (ignored once it is gone)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])


def stop_all(children: Sequence[Child], grace_s: float) -> list[str]:
    """SIGTERM every child's group, wait up to `grace_s`, SIGKILL what is left. Returns the
    names of those that had to be killed."""
    for child in children:
        if child.exit_code() is None:
            child.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(c.exit_code() is None for c in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    killed = [c for c in children if c.exit_code() is None]
    for child in killed:
        child.signal(signal.SIGKILL)
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(timeout=5)
    return [c.name for c in killed]
