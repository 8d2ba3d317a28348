"""Processes of a session (the launcher starts one with start_new_session): its children and
theirs, tensor-parallel rank workers included."""

from __future__ import annotations

from pathlib import Path


def session_processes(session_id: int) -> list[int]:
    """Live (not zombie) processes whose session is ``session_id``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[3]) == session_id:  # state, ppid, pgrp, session
            found.append(int(entry.name))
    return found


def rank_workers(node_pid: int) -> list[int]:
    """The tensor-parallel rank processes a node spawned (not multiprocessing's helpers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == node_pid and b"spawn_main" in cmdline and fields[0] != "Z":
            found.append(int(entry.name))
    return found
