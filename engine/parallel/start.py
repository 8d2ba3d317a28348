"""How the ranks of a multi-rank engine start: each rank checks in on rank 0's store before
it joins the group, and rank 0 waits for them in short slices, watching their processes, so
a rank that exits while starting fails the engine at once (not after the group's timeout).

A rank is a spawned process, which imports the script that started the engine as its main
module; a script that starts the engine at module level (no ``__main__`` guard) would start
it again in every rank. The rank then exits with ``UNGUARDED_MAIN_EXIT``, which rank 0
explains with ``GUARD_HINT``.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import sys
import time
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from typing import cast

import torch.distributed as dist

log = logging.getLogger(__name__)

UNGUARDED_MAIN_EXIT = 5  # a rank's exit code: its main module started an engine on import
POLL_S = 0.1  # how often rank 0 looks at the store while the ranks start
_JOIN_S = 10.0  # an ended process' exit code comes at once; a bound all the same

GUARD_HINT = (
    "each rank is a spawned process that imports the main script again, and this script "
    "starts a multi-rank engine as it is imported: put the code that starts it under "
    '`if __name__ == "__main__":` in {script}'
)


def main_script() -> str:
    """The main module's file (the script the ranks import again), for messages."""
    for name in ("__mp_main__", "__main__"):  # a spawned process imports it as __mp_main__
        script = getattr(sys.modules.get(name), "__file__", None)
        if script:
            return str(script)
    return "the main script"


def refuse_unguarded_start() -> None:
    """In a spawned process still importing its parent's main script (multiprocessing's
    bootstrap), starting an engine means the script lacks a ``__main__`` guard: exit with
    ``UNGUARDED_MAIN_EXIT`` (its parent names the fix) instead of spawning ranks of ranks."""
    if not getattr(multiprocessing.current_process(), "_inheriting", False):
        return
    log.error("engine_start_refused reason=no_main_guard script=%s", main_script())
    raise SystemExit(UNGUARDED_MAIN_EXIT)


def exit_message(role: str, rank: int, process: BaseProcess, consequence: str) -> str:
    """An exited rank for errors: its exit code, then ``consequence`` (or the fix, for a
    rank that found the main script starting an engine as it is imported)."""
    exited = f"{role} rank {rank} (pid {process.pid}) exited with code {process.exitcode}"
    if process.exitcode == UNGUARDED_MAIN_EXIT:
        return f"{exited}: {GUARD_HINT.format(script=main_script())}"
    return f"{exited}; {consequence}"


def reap(processes: Sequence[BaseProcess]) -> None:
    """Collect the exit codes of those ``processes`` that have ended."""
    by_sentinel = {p.sentinel: p for p in processes}
    for sentinel in multiprocessing.connection.wait(list(by_sentinel), timeout=0):
        by_sentinel[cast(int, sentinel)].join(_JOIN_S)


def joined_key(rank: int) -> str:
    return f"splitserve/rank-started/{rank}"


def check_in(store: dist.Store, rank: int) -> None:
    """A rank tells rank 0 it is about to join the group."""
    store.set(joined_key(rank), "1")


def await_ranks(
    store: dist.Store,
    processes: Sequence[BaseProcess],
    timeout_s: float,
    on_exit: Callable[[], Exception],
) -> None:
    """Rank 0 waits until ranks 1..N-1 (``processes``) have checked in on ``store``; raises
    ``on_exit()`` as soon as one of them exits (its exit code collected), TimeoutError after
    ``timeout_s``."""
    keys = [joined_key(rank) for rank in range(1, len(processes) + 1)]
    sentinels = [p.sentinel for p in processes]
    deadline = time.monotonic() + timeout_s
    while not store.check(keys):
        if multiprocessing.connection.wait(sentinels, timeout=POLL_S):
            reap(processes)
            raise on_exit()
        if time.monotonic() > deadline:
            missing = [k.rsplit("/", 1)[1] for k in keys if not store.check([k])]
            raise TimeoutError(f"engine ranks {', '.join(missing)} did not start in {timeout_s} s")
