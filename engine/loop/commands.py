"""Commands: callables the engine thread runs on the engine between two steps."""

from __future__ import annotations

import concurrent.futures as cf
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.engine import LLMEngine

log = logging.getLogger("splitserve.engine.loop.engine_loop")

Command = Callable[[LLMEngine], Any]


@dataclass(frozen=True)
class Job:
    """A queued command; `future` receives its result or exception."""

    command: Command
    future: cf.Future[Any] | None  # None: fire and forget, errors are logged

    def run(self, engine: LLMEngine, refresh: Callable[[], None]) -> None:
        """Run the command, `refresh` the loop's snapshot, then hand over the result, so a
        caller that awaited the command reads numbers that include its effect."""
        if self.future is None:
            try:
                self.command(engine)
            except Exception:
                log.exception("engine command failed")
            refresh()
            return
        if not self.future.set_running_or_notify_cancel():
            return  # the caller gave up before it ran
        try:
            result = self.command(engine)
        except Exception as exc:
            refresh()
            self.future.set_exception(exc)
            return
        refresh()
        self.future.set_result(result)
