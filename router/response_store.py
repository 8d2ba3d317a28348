"""Stored responses of the Responses API (`store`), in Redis with a time to live.

A record holds the response as answered and the whole conversation that led to it (input
items, earlier turns included), so `previous_response_id` reads one key. Redis down: storing
is skipped (logged) and reading answers 503; the response itself is still served.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from cluster.registry import REDIS_ERRORS, connect
from router.errors import APIError, unavailable

log = logging.getLogger("splitserve.router")
PREFIX = "splitserve:response:"


class ResponseStore:
    def __init__(self, redis_url: str, ttl_s: int, retry_after_s: int) -> None:
        self._redis = connect(redis_url)
        self._ttl_s = ttl_s
        self._retry_after_s = retry_after_s

    async def put(self, response_id: str, record: dict[str, Any]) -> None:
        try:
            await self._redis.set(PREFIX + response_id, json.dumps(record), ex=self._ttl_s)
        except REDIS_ERRORS as exc:
            log.warning("response_not_stored id=%s error=%s", response_id, type(exc).__name__)

    async def get(self, response_id: str, param: str | None = None) -> dict[str, Any]:
        """The record, or 404 naming `param` when it is unknown or expired."""
        try:
            raw = await self._redis.get(PREFIX + response_id)
        except REDIS_ERRORS:
            raise unavailable("the response store is unavailable", self._retry_after_s,
                              code="store_unavailable") from None  # fmt: skip
        if raw is None:
            raise APIError(404, f"no stored response {response_id!r} (unknown or expired)",
                           param=param, code="response_not_found")  # fmt: skip
        record: dict[str, Any] = json.loads(raw)
        return record

    async def delete(self, response_id: str) -> bool:
        try:
            return bool(await self._redis.delete(PREFIX + response_id))
        except REDIS_ERRORS:
            raise unavailable("the response store is unavailable", self._retry_after_s,
                              code="store_unavailable") from None  # fmt: skip

    async def close(self) -> None:
        await self._redis.aclose()
