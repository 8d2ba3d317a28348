"""bench.llama_cpp_decode runs llama.cpp in a child: a child killed by a signal is retried once
with the extra buffer types off and the report names the mode that ran; a child that fails
without a signal is not retried."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench import llama_cpp_decode

REPORT = {"threads": 2, "steps": 4, "median_token_s": 0.01, "tok_s": 100.0}


def fake_children(monkeypatch: pytest.MonkeyPatch, codes: list[int]) -> list[list[str]]:
    """Children that exit with ``codes`` in turn (0: print the report)."""
    calls: list[list[str]] = []

    def run(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        code = codes[len(calls)]
        calls.append(cmd)
        out = json.dumps(REPORT) + "\n" if code == 0 else ""
        return subprocess.CompletedProcess(cmd, code, out, "boom" if code else "")

    monkeypatch.setattr(llama_cpp_decode.subprocess, "run", run)
    return calls


def test_a_crash_is_retried_without_extra_buffer_types(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_children(monkeypatch, [-11, 0])
    report = llama_cpp_decode.run(Path("m.gguf"), [5, 6, 7], 2, 4)
    assert report["mode"] == "no_extra_bufts" and report["tok_s"] == 100.0
    assert report["failed"][0]["mode"] == "default" and report["failed"][0]["returncode"] == -11
    assert "--no-extra-bufts" not in calls[0] and "--no-extra-bufts" in calls[1]
    assert calls[0][calls[0].index("--prompt") + 1] == "5,6,7"
    assert calls[0][calls[0].index("--threads") + 1] == "2"


def test_the_default_mode_when_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_children(monkeypatch, [0])
    report = llama_cpp_decode.run(Path("m.gguf"), [1], 1, 4)
    assert report["mode"] == "default" and report["failed"] == [] and len(calls) == 1


def test_an_error_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_children(monkeypatch, [1, 0])
    with pytest.raises(RuntimeError, match=r"llama\.cpp decode failed"):
        llama_cpp_decode.run(Path("m.gguf"), [1], 1, 4)
    assert len(calls) == 1
