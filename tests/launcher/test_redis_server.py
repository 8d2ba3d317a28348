"""The embedded Redis picks its port again when another process took the first pick."""

from __future__ import annotations

import socket

import pytest
import redis

from launcher import redis_server
from launcher.redis_server import EmbeddedRedis, RedisStartError


def test_a_port_taken_before_redis_binds_it_is_picked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        picks = [taken.getsockname()[1]]
        real = redis_server.free_port

        def pick(host: str = "127.0.0.1") -> int:
            picks.append(real(host))
            return picks[-2]  # the taken port first, then fresh ones

        monkeypatch.setattr(redis_server, "free_port", pick)
        with EmbeddedRedis() as server:
            assert server.port not in (None, taken.getsockname()[1])
            assert redis.Redis.from_url(server.url).ping()


def test_a_port_given_by_the_caller_is_not_changed() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(RedisStartError, match="exited at start"):
            EmbeddedRedis(port=port).start()
