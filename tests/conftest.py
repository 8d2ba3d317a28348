"""Shared fixtures. Triton runs in interpreter mode on machines without a GPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

if not os.environ.get("TRITON_INTERPRET"):
    try:
        import torch

        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"  # must precede the first triton import
    except ImportError:
        pass


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker per core this process may use, at most 4 (each e2e test starts a
    cluster of several processes); PYTEST_XDIST_AUTO_NUM_WORKERS overrides, `-n 0` runs
    everything in one process."""
    wanted = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").strip()
    if wanted:
        return int(wanted)
    return max(1, min(len(os.sched_getaffinity(0)), 4))


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist, each worker's torch threads (and so the C kernels' OpenMP threads): the
    cores over the workers, at least one. Two workers each running 2-thread OpenMP regions on
    2 cores wait at every barrier for a thread the other worker holds: an engine test that
    took 4 s alone took 176 s in the suite."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workers))


def pytest_sessionstart(session: pytest.Session) -> None:
    """Where a C compiler exists, the CPU kernels must build: the kernel tests skip when the
    kernels are unavailable, so a failed build (an error, a timeout) would otherwise turn
    them all into skips. Building once here also keeps the build out of any test's time."""
    if os.environ.get("SPLITSERVE_CPU_KERNELS", "1") == "0":
        return
    from engine.cpu_kernels.build import KernelBuildError, build

    try:
        build()
    except KernelBuildError as exc:
        if "no C compiler found" not in str(exc):
            raise pytest.UsageError(f"the CPU kernels did not build: {exc}") from None


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The default model as a HF directory, pulled once through the project's own code.

    SPLITSERVE_TEST_MODEL_DIR points at an already converted copy to skip the pull.
    """
    override = os.environ.get("SPLITSERVE_TEST_MODEL_DIR")
    if override:
        return Path(override)
    from models import ensure_model

    return ensure_model("smollm2")


@pytest.fixture
def every_guess(monkeypatch: pytest.MonkeyPatch) -> None:
    """Speculating engines verify every guess offered: the step-cost model, which prices
    guesses by measured step times, would make the guesses (and so a sampled run's draws)
    depend on the machine's speed. Its own tests are in tests/engine/test_speculative_cost.py."""
    from engine.speculative.cost import StepCost

    monkeypatch.setattr(
        StepCost, "allocate", lambda self, base, gains, *rest: [len(g) for g in gains]
    )
