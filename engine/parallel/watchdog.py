"""A rank exits when the engine process that started it is gone (even SIGKILLed): no
orphan keeps its share of the weights and KV cache."""

from __future__ import annotations

import os
import threading

POLL_S = 0.25


def watch_parent(parent_pid: int, poll_s: float = POLL_S) -> threading.Thread:
    """Start a daemon thread that ends this process (exit code 3) once its parent is no
    longer ``parent_pid`` (the kernel re-parents an orphan)."""

    def watch() -> None:
        stop = threading.Event()
        while not stop.wait(poll_s):
            if os.getppid() != parent_pid:
                os._exit(3)

    thread = threading.Thread(target=watch, name="parent-watchdog", daemon=True)
    thread.start()
    return thread
