"""A SIGKILLed engine process leaves no rank behind: each rank's watchdog ends it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tiny_llama import save_tiny_llama

DEADLINE_S = 120.0
_ENGINE = """
import sys
from engine.config import EngineConfig
from engine.engine import LLMEngine

if __name__ == "__main__":
    engine = LLMEngine(EngineConfig(model_dir=sys.argv[1], tensor_parallel_size=2,
                                    num_kv_blocks=16))
    print(*engine.ranks.pids, flush=True)
    sys.stdin.read()  # until killed
"""


def gone(pid: int) -> bool:
    """No such process, or only its zombie (exited, not yet reaped by its new parent)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def test_ranks_exit_when_their_engine_process_is_killed(tmp_path: Path) -> None:
    save_tiny_llama(tmp_path)
    script = tmp_path / "engine_main.py"
    script.write_text(_ENGINE)
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 1 and not gone(pids[0])
        proc.send_signal(signal.SIGKILL)
        proc.wait(DEADLINE_S)
        deadline = time.monotonic() + DEADLINE_S
        while not all(map(gone, pids)):
            assert time.monotonic() < deadline, f"rank {pids} outlived its engine"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()


def test_the_watchdog_ends_a_process_whose_parent_is_not_the_one_named() -> None:
    # the process' parent is this test, not pid 1: as if its engine had died and init
    # adopted it; it blocks forever unless the watchdog ends it
    code = (
        "import threading\n"
        "from engine.parallel.watchdog import watch_parent\n"
        "watch_parent(1)\n"
        "threading.Event().wait()\n"
    )
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, timeout=DEADLINE_S)
    assert proc.returncode == 3
