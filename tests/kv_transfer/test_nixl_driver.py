"""The NIXL driver thread's order of work around one transfer, with a stand-in agent: the
caller goes on as soon as the transfer completes; the handle's release and the release
notice come after, and a failure of either is logged, never lost. A failed transfer is
cleaned up before the caller sees its error."""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kv_transfer.deadline import Deadline
from kv_transfer.errors import TransferError
from kv_transfer.nixl_driver import NixlDriver


class Handle:
    """A transfer handle whose release waits for `gate` (when given) and may fail."""

    def __init__(self, gate: threading.Event | None = None, fail: bool = False) -> None:
        self.gate, self.fail = gate, fail
        self.released = threading.Event()

    def release(self) -> None:
        if self.gate is not None:
            self.gate.wait(30)
        self.released.set()
        if self.fail:
            raise RuntimeError("release refused")


class Agent:
    """Answers `transfer()`, then each state check, from `states` in order."""

    def __init__(self, *states: str) -> None:
        self.states = list(states)

    def transfer(self, handle: Handle) -> str:
        return self.states.pop(0)

    def check_xfer_state(self, handle: Handle) -> str:
        return self.states.pop(0)


@pytest.fixture
def driver() -> Iterator[NixlDriver]:
    driver = NixlDriver("test", notify_interval_s=0.02)
    yield driver
    driver.stop()


def start(
    driver: NixlDriver,
    agent: Agent,
    handle: Handle,
    finished: list[TransferError | None],
    on_done: Callable[[Any, Any], None] | None = None,
) -> cf.Future[None]:
    return driver.transfer(lambda: (agent, handle), Deadline.after(10), finished.append, on_done)


def wait_until(condition: Callable[[], bool]) -> None:
    give_up = time.monotonic() + 10
    while not condition() and time.monotonic() < give_up:
        time.sleep(0.005)
    assert condition()


def test_the_caller_goes_on_before_the_handle_release_and_the_notice(
    driver: NixlDriver,
) -> None:
    gate, ready = threading.Event(), threading.Event()
    handle, finished = Handle(gate), []
    seen_done: list[bool] = []
    driver.submit(lambda: ready.wait(10))  # the driver goes on once `future` is bound
    future = start(
        driver, Agent("PROC", "DONE"), handle, finished, lambda *_: seen_done.append(future.done())
    )
    ready.set()
    assert future.result(timeout=10) is None  # while the handle's release still waits
    assert seen_done == [False]  # the completion hook (window, telemetry) came first
    assert not handle.released.is_set() and finished == []
    gate.set()
    wait_until(lambda: finished == [None])  # the release notice still goes out
    assert handle.released.is_set()


def test_a_handle_release_that_fails_after_completion_is_logged_and_the_notice_sent(
    driver: NixlDriver, caplog: pytest.LogCaptureFixture
) -> None:
    handle, finished = Handle(fail=True), []
    with caplog.at_level(logging.ERROR, logger="kv_transfer"):
        assert start(driver, Agent("DONE"), handle, finished).result(timeout=10) is None
        wait_until(lambda: finished == [None])
    assert "could not release a transfer handle" in caplog.text


def test_a_failed_transfer_is_cleaned_up_before_the_caller_sees_it(driver: NixlDriver) -> None:
    handle, finished = Handle(), []
    error = start(driver, Agent("PROC", "PROC", "ERR"), handle, finished).exception(timeout=10)
    assert isinstance(error, TransferError) and "state ERR" in str(error)
    assert handle.released.is_set()  # no NIXL request writes any more
    assert finished == [error]
