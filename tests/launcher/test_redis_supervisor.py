"""The embedded Redis comes back on its port after a SIGKILL, within a restart budget."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis

from launcher.redis_server import EmbeddedRedis
from launcher.redis_supervisor import RedisSupervisor, RestartPolicy

FAST = RestartPolicy(max_restarts=2, window_s=60, first_backoff_s=0.05, max_backoff_s=0.1)


def _kill(server: EmbeddedRedis) -> None:
    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while server.running:
        assert time.monotonic() < deadline, "redis-server did not die"
        time.sleep(0.01)


def _supervise_until(keeper: RedisSupervisor) -> None:
    """Call check() like the launcher does until Redis runs again or the keeper gives up."""
    deadline = time.monotonic() + 20
    while not (keeper.redis.running or keeper.gave_up):
        assert time.monotonic() < deadline, "no restart in time"
        keeper.check()
        time.sleep(0.01)


def test_a_killed_redis_restarts_on_the_same_port_until_the_budget_is_spent() -> None:
    pids: list[int] = []
    with EmbeddedRedis() as server:
        port, first_pid = server.port, server.pid
        keeper = RedisSupervisor(server, FAST, on_restart=pids.append)
        for round_ in (1, 2):
            _kill(server)
            _supervise_until(keeper)
            assert server.running and server.port == port and keeper.restarts == round_
            client = redis.Redis.from_url(server.url, socket_timeout=2)
            assert client.ping()
            client.close()
        assert len(set(pids)) == 2 and first_pid not in pids
        _kill(server)
        _supervise_until(keeper)
        assert keeper.gave_up and not server.running and keeper.restarts == 2


def test_the_policy_is_validated() -> None:
    with pytest.raises(ValueError, match="max_restarts"):
        RestartPolicy(max_restarts=-1)
    with pytest.raises(ValueError, match="first_backoff_s"):
        RestartPolicy(first_backoff_s=2, max_backoff_s=1)
