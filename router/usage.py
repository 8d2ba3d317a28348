"""Usage per API key, and the limits per key.

Every answered request is charged to its key's name (`anonymous` when the router needs no
key): requests, prompt, completion and cached tokens, exactly the `usage` its response
carried. They show in /metrics (`splitserve_router_key_*_total{key}`) and at GET /v1/usage.

Limits (requests and tokens per minute, cluster.key_limits) look back over the last 60 s.
A key over either limit gets 429 with Retry-After (seconds until enough of its last minute
has passed) before any work is done on the request; other keys are unaffected. Tokens are
charged when a request ends, so a key can overshoot its token limit by the requests it has
running; the next ones wait.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from cluster.key_limits import KeyLimit, limit_for
from router.errors import APIError

ANONYMOUS = "anonymous"
WINDOW_S = 60.0


@dataclass
class KeyUsage:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def as_dict(self, name: str) -> dict[str, object]:
        return {
            "key": name,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


class _Window:
    """Amounts with their times over the last WINDOW_S seconds."""

    def __init__(self) -> None:
        self.events: deque[tuple[float, int]] = deque()
        self.total = 0

    def add(self, now: float, amount: int) -> None:
        self.events.append((now, amount))
        self.total += amount

    def prune(self, now: float) -> None:
        while self.events and self.events[0][0] <= now - WINDOW_S:
            self.total -= self.events.popleft()[1]

    def wait_below(self, limit: int, now: float) -> float:
        """Seconds until the total drops below `limit` as old amounts leave the window."""
        left = self.total
        for at, amount in self.events:
            if left < limit:
                break
            left -= amount
            if left < limit:
                return max(at + WINDOW_S - now, 0.0)
        return 0.0


class UsageLedger:
    def __init__(
        self,
        registry: CollectorRegistry,
        base: tuple[str, str],
        limits: dict[str, KeyLimit],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self.clock = clock
        self.usage: dict[str, KeyUsage] = {}
        self._requests: dict[str, _Window] = {}
        self._tokens: dict[str, _Window] = {}
        labels = ["role", "node", "key"]

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, [*labels, *extra], registry=registry)

        self._base = base
        self._m_requests = counter("splitserve_router_key_requests", "Requests answered, by key")
        self._m_prompt = counter("splitserve_router_key_prompt_tokens", "Prompt tokens, by key")
        self._m_completion = counter(
            "splitserve_router_key_completion_tokens", "Completion tokens, by key"
        )
        self._m_cached = counter(
            "splitserve_router_key_cached_tokens", "Prompt tokens found cached, by key"
        )
        self._m_limited = counter(
            "splitserve_router_key_rate_limited",
            "Requests refused by a per-key limit, by key and limit (rpm, tpm)",
            ("limit",),
        )

    def admit(self, name: str) -> None:
        """Count one request against `name`'s limits, or raise 429 when it is over one."""
        limit = limit_for(self.limits, name)
        if limit.requests_per_minute is None and limit.tokens_per_minute is None:
            return
        now = self.clock()
        requests = self._requests.setdefault(name, _Window())
        tokens = self._tokens.setdefault(name, _Window())
        requests.prune(now)
        tokens.prune(now)
        checks = (
            ("rpm", "requests", requests, limit.requests_per_minute),
            ("tpm", "tokens", tokens, limit.tokens_per_minute),
        )
        for kind, unit, window, cap in checks:
            if cap is not None and window.total >= cap:
                self._m_limited.labels(*self._base, name, kind).inc()
                wait = max(1, math.ceil(window.wait_below(cap, now)))
                raise APIError(
                    429,
                    f"the API key {name!r} used its {cap} {unit} per minute; retry in {wait}s",
                    type="rate_limit_error",
                    code="rate_limit_exceeded",
                    retry_after_s=wait,
                )
        requests.add(now, 1)

    def charge(self, name: str, prompt: int, completion: int, cached: int) -> None:
        """One answered request's usage, as its response reported it."""
        usage = self.usage.setdefault(name, KeyUsage())
        usage.requests += 1
        usage.prompt_tokens += prompt
        usage.completion_tokens += completion
        usage.cached_tokens += cached
        b = (*self._base, name)
        self._m_requests.labels(*b).inc()
        self._m_prompt.labels(*b).inc(prompt)
        self._m_completion.labels(*b).inc(completion)
        self._m_cached.labels(*b).inc(cached)
        if limit_for(self.limits, name).tokens_per_minute is not None:
            self._tokens.setdefault(name, _Window()).add(self.clock(), prompt + completion)

    def report(self) -> list[dict[str, object]]:
        return [u.as_dict(name) for name, u in sorted(self.usage.items())]
