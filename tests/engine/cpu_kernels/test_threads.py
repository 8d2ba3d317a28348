"""Helper threads that run torch ops beside the engine make no OpenMP pool of their own
(engine.cpu_kernels.threads): more pooled threads than cores slows every engine step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from engine.cpu_kernels.threads import _set_omp_threads, serial_torch_ops
from engine.kv import copier as copier_module
from engine.kv.cache import KVLayout, allocate_kv_cache
from engine.kv.copier import TierCopier

# Run in a fresh process: in the test session other tests' threads come and go.
PROBE = """
import json, os, threading, time
import torch
from engine.cpu_kernels.threads import serial_torch_ops

def tasks():
    return len(os.listdir("/proc/self/task"))

def settle(want):  # exited threads (and their OpenMP workers) leave /proc
    deadline = time.monotonic() + 60
    while tasks() != want and time.monotonic() < deadline:
        time.sleep(0.01)

def added_by(body):  # (OS threads gained while a thread ran body, its torch thread count)
    ready, done, seen = threading.Event(), threading.Event(), []
    def run():
        body()
        torch.ones(1 << 22).mul_(3)  # parallel in torch when the thread may go wide
        seen.append(torch.get_num_threads())
        ready.set()
        done.wait(60)
    before = tasks()
    thread = threading.Thread(target=run)
    thread.start()
    ready.wait(60)
    added = tasks() - before
    done.set()
    thread.join(60)
    return added, seen[0]

torch.set_num_threads(2)
torch.ones(1 << 22).mul_(2)  # this thread's pool exists before any count
baseline = tasks()
serial = added_by(serial_torch_ops)
main_count = torch.get_num_threads()
settle(baseline)
plain = added_by(lambda: None)
print(json.dumps({"serial": serial, "plain": plain, "main": main_count}))
"""


@pytest.mark.skipif(_set_omp_threads() is None, reason="torch without libgomp")
def test_a_serial_thread_adds_itself_only_and_leaves_other_threads_wide() -> None:
    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=str(root))
    run = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300
    )
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["serial"] == [1, 1]  # the thread itself, no pool; its torch count is 1
    assert found["main"] == 2  # the calling thread's count is untouched
    assert found["plain"] == [2, 2]  # the control: a plain thread gets a pool of 2


def test_the_kv_tier_copier_thread_runs_torch_serially(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def recorded() -> None:
        calls.append(threading.current_thread().name)
        serial_torch_ops()

    monkeypatch.setattr(copier_module, "serial_torch_ops", recorded)
    layout = KVLayout("m", "float32", block_size=4, num_layers=2, num_kv_heads=2, head_dim=8)
    copier = TierCopier(allocate_kv_cache(layout, 4, torch.device("cpu")), layout, 4, None)
    try:
        copier.flush()
        assert calls == ["kv-tier-copier"]
    finally:
        copier.close()
