"""Keeps the embedded Redis of `splitserve up` alive: a redis-server that dies is started
again on the same port, so every process keeps its URL.

Nodes re-register at their next heartbeat and the router's membership poll picks them up
again (cluster.registry); in between the router serves with the last known membership.
Restarts back off (doubling from `first_backoff_s` up to `max_backoff_s`) and are bounded:
after `max_restarts` restarts within `window_s` the supervisor gives up and the launcher
stops the cluster.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from launcher.redis_server import EmbeddedRedis, RedisStartError


def _say(line: str) -> None:
    """The launcher's output (stderr), in the event key=value style of the logs."""
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class RestartPolicy:
    """How often a dead redis-server is restarted."""

    max_restarts: int = 5
    window_s: float = 300.0
    first_backoff_s: float = 0.2
    max_backoff_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if not 0 < self.first_backoff_s <= self.max_backoff_s:
            raise ValueError("need 0 < first_backoff_s <= max_backoff_s")
        if self.window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {self.window_s}")


class RedisSupervisor:
    """Call `check()` periodically; it restarts Redis when due. `gave_up` ends the cluster."""

    def __init__(
        self,
        redis: EmbeddedRedis,
        policy: RestartPolicy | None = None,
        on_restart: Callable[[int], None] | None = None,
    ) -> None:
        """`on_restart(pid)` runs after each successful restart."""
        self.redis = redis
        self._on_restart = on_restart
        self.policy = policy or RestartPolicy()
        self.restarts = 0  # successful restarts, over the whole run
        self.gave_up = False
        self._recent: deque[float] = deque()  # restart attempts within the window
        self._next_try = 0.0
        self._backoff = self.policy.first_backoff_s

    def check(self) -> None:
        """Restart a dead redis-server once its backoff has passed; never raises."""
        if self.gave_up or self.redis.running:
            return
        now = time.monotonic()
        if now < self._next_try:
            return
        while self._recent and now - self._recent[0] > self.policy.window_s:
            self._recent.popleft()
        if not self._recent:  # a quiet window: start over with the shortest backoff
            self._backoff = self.policy.first_backoff_s
        if len(self._recent) >= self.policy.max_restarts:
            self.gave_up = True
            _say(f"redis_gave_up restarts={len(self._recent)} window_s={self.policy.window_s:.0f}")
            return
        self._recent.append(now)
        self._restart(now)

    def _restart(self, now: float) -> None:
        self.redis.stop()  # reaps the dead process and removes its directory
        try:
            self.redis.start()
        except RedisStartError as exc:
            self._next_try = now + self._backoff
            _say(f"redis_restart_failed port={self.redis.port} error={exc}")
        else:
            self.restarts += 1
            self._next_try = now + self._backoff
            if self._on_restart is not None and self.redis.pid is not None:
                self._on_restart(self.redis.pid)
            _say(
                f"redis_restarted port={self.redis.port} restarts={self.restarts} "
                f"pid={self.redis.pid}"
            )
        self._backoff = min(self._backoff * 2, self.policy.max_backoff_s)
