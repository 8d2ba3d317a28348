"""What `splitserve up` shows while its nodes start: each phase a node logs as it passes (once,
though ranks log it again), each node's readiness, and a status line when nothing else was
said for a while; the lines it reads are the ones engine.phases writes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cluster.log_format import configure_logging
from engine.phases import phase
from launcher.up_progress import STATUS_S, LogTail, StartProgress


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _log(path: Path, *lines: str) -> None:
    with open(path, "a") as f:
        for line in lines:
            f.write(f"2026-01-01 00:00:00,000 level=INFO logger=splitserve.engine.phases {line}\n")


def test_phases_are_shown_as_they_pass_then_ready(tmp_path: Path) -> None:
    said: list[str] = []
    clock = _Clock()
    logs = {"prefill-0": tmp_path / "prefill-0.log", "decode-0": tmp_path / "decode-0.log"}
    progress = StartProgress(logs, said.append, clock)
    progress.poll()  # no log file yet
    _log(logs["prefill-0"], "phase=kernels begin", "phase=kernels seconds=26.04")
    _log(logs["decode-0"], "phase=kernels begin", "phase=kernels seconds=0.03")
    _log(logs["decode-0"], "phase=weights begin", "phase=weights seconds=2.51")
    _log(logs["decode-0"], "phase=weights begin", "phase=weights seconds=2.49")  # a rank's
    clock.now += 3
    progress.poll()
    assert said == [
        "  prefill-0: kernels 26.0s",
        "  decode-0: kernels 0.0s",
        "  decode-0: weights 2.5s",
    ]
    del said[:]
    clock.now += 2
    progress.ready("decode-0")
    progress.ready("decode-0")  # shown once
    assert said == ["  decode-0: ready after 5.0s"]


def test_a_status_line_names_where_each_waiting_node_is(tmp_path: Path) -> None:
    said: list[str] = []
    clock = _Clock()
    logs = {"prefill-0": tmp_path / "p.log", "decode-0": tmp_path / "d.log"}
    progress = StartProgress(logs, said.append, clock)
    _log(logs["prefill-0"], "phase=kernels begin")
    clock.now += STATUS_S - 1
    progress.poll()
    assert said == []  # not yet due
    clock.now += 1
    progress.poll()
    assert said == ["  starting (10s): prefill-0 (kernels), decode-0 (starting)"]
    _log(logs["prefill-0"], "phase=kernels seconds=12.5")
    clock.now += 1
    progress.poll()
    progress.ready("prefill-0")
    clock.now += STATUS_S
    progress.poll()
    assert said[1:] == [
        "  prefill-0: kernels 12.5s",
        "  prefill-0: ready after 11.0s",
        "  starting (21s): decode-0 (starting)",
    ]


def test_a_line_is_read_only_once_it_is_complete(tmp_path: Path) -> None:
    path = tmp_path / "node.log"
    tail = LogTail(path)
    assert tail.lines() == []
    path.write_bytes(b"first\nsec")
    assert tail.lines() == ["first"]
    with open(path, "ab") as f:
        f.write(b"ond\n")
    assert tail.lines() == ["second"] and tail.lines() == []


def test_the_engine_phase_lines_are_the_ones_up_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A node's log, as configure_logging formats it, shows up as the launcher's progress."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    root.handlers.clear()
    try:
        configure_logging("info")
        with phase("weights"):
            pass
    finally:
        root.handlers[:], root.level = saved
    log = tmp_path / "decode-0.log"
    log.write_text(capsys.readouterr().err)
    said: list[str] = []
    StartProgress({"decode-0": log}, said.append).poll()
    assert len(said) == 1 and said[0].startswith("  decode-0: weights ")
