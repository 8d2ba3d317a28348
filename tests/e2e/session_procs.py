"""Processes of a session (the launcher starts one with start_new_session): its children and
theirs, tensor-parallel rank workers included."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path


def _live() -> Iterator[tuple[int, list[str], Path]]:
    """(pid, the stat fields after the name, /proc entry) of every live, non-zombie process."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":  # fields: state, ppid, pgrp, session, ...
            yield int(entry.name), fields, entry


def session_processes(session_id: int) -> list[int]:
    """Live processes whose session is ``session_id``."""
    return [pid for pid, fields, _ in _live() if int(fields[3]) == session_id]


def rank_workers(node_pid: int) -> list[int]:
    """The tensor-parallel rank processes a node spawned (not multiprocessing's helpers)."""
    found = []
    for pid, fields, entry in _live():
        if int(fields[1]) != node_pid:
            continue
        try:
            if b"spawn_main" in (entry / "cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found
