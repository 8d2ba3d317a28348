"""A multi-rank engine whose rank exits while it starts fails at once, naming the rank and
its exit code (not after the group's 10-minute rendezvous timeout), and leaves no rank
behind; a script that starts one without a ``__main__`` guard is told to add it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from multiprocessing.context import SpawnProcess
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from tiny_llama import save_tiny_text_model

import engine.engine
from engine.llm import LLM
from engine.parallel import RankFailed

DEADLINE_S = 120.0  # far below the group's timeout (600 s), for a loaded machine
KILLED = r"rank 1 \(pid \d+\) exited with code -9; the engine did not start"
_UNGUARDED = """
import sys
from engine.llm import LLM

LLM(sys.argv[1], tensor_parallel_size=2, num_kv_blocks=16)
"""


def test_a_script_without_a_main_guard_is_told_to_add_one(tmp_path: Path) -> None:
    save_tiny_text_model(tmp_path)
    script = tmp_path / "unguarded.py"
    script.write_text(_UNGUARDED)
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("engine.parallel.group.RankFailed: tensor-parallel rank 1 (pid ")
    assert f'put the code that starts it under `if __name__ == "__main__":` in {script}' in last


def test_a_rank_killed_as_it_starts_fails_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_tiny_text_model(tmp_path)
    start = SpawnProcess.start

    def start_and_kill(process: SpawnProcess) -> None:
        start(process)
        assert process.pid is not None
        os.kill(process.pid, signal.SIGKILL)

    monkeypatch.setattr(SpawnProcess, "start", start_and_kill)
    began = time.monotonic()
    with pytest.raises(RankFailed, match=rf"^tensor-parallel {KILLED}$"):
        LLM(tmp_path, tensor_parallel_size=2, num_kv_blocks=16)
    assert time.monotonic() - began < DEADLINE_S
    assert not dist.is_initialized()  # the next engine may start


def test_a_rank_killed_while_the_engine_loads_fails_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the ranks formed their group; rank 0 then builds its runner, which agrees on the KV
    # block count with the ranks: a rank killed before that is named, not the collective
    save_tiny_text_model(tmp_path)
    runner = engine.engine.ModelRunner
    ranks: list[Any] = []

    def kill_ranks_then_load(*args: Any, **kwargs: Any) -> Any:
        ranks.append(kwargs["ranks"])
        for process in kwargs["ranks"].processes:
            process.kill()
            process.join()
        return runner(*args, **kwargs)

    monkeypatch.setattr(engine.engine, "ModelRunner", kill_ranks_then_load)
    with pytest.raises(RankFailed, match=rf"^pipeline stage 1 .*: {KILLED}$"):
        LLM(tmp_path, pipeline_parallel_size=2, num_kv_blocks=16)
    assert not dist.is_initialized()
    assert not any(p.is_alive() for p in ranks[0].processes)
