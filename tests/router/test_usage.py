"""The per-key ledger on an injected clock: token and request limits over the last minute,
Retry-After until enough of it has passed, keys without limits never refused."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from cluster.key_limits import KeyLimit, parse_key_limits
from router.errors import APIError
from router.usage import UsageLedger


class _Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def _ledger(limits: str) -> tuple[UsageLedger, _Clock]:
    clock = _Clock()
    ledger = UsageLedger(CollectorRegistry(), ("router", "r0"), parse_key_limits(limits), clock)
    return ledger, clock


def test_tokens_per_minute_refuse_until_the_window_has_room() -> None:
    ledger, clock = _ledger("alice:tpm=100;*:rpm=1000")
    ledger.admit("alice")
    ledger.charge("alice", prompt=40, completion=30, cached=0)  # at t=100
    clock.now = 120.0
    ledger.admit("alice")
    ledger.charge("alice", prompt=20, completion=20, cached=5)  # 110 tokens in the window
    clock.now = 130.0
    with pytest.raises(APIError) as refused:
        ledger.admit("alice")
    assert refused.value.status == 429 and refused.value.retry_after_s == 30  # t=100 leaves
    clock.now = 160.5
    ledger.admit("alice")  # 40 tokens left in the window
    assert ledger.report()[0] == {
        "key": "alice", "requests": 2, "prompt_tokens": 60, "completion_tokens": 50,
        "cached_tokens": 5, "total_tokens": 110,
    }  # fmt: skip


def test_requests_per_minute_and_the_default_entry() -> None:
    ledger, clock = _ledger("*:rpm=2;vip:tpm=1000000")
    for _ in range(2):
        ledger.admit("bob")
    with pytest.raises(APIError, match="2 requests per minute"):
        ledger.admit("bob")
    for _ in range(10):
        ledger.admit("vip")  # its own entry has no request limit
    clock.now += 60.0
    ledger.admit("bob")


def test_limits_parse_or_name_the_bad_entry() -> None:
    assert parse_key_limits("a:rpm=1,tpm=2; b:tpm=3") == {
        "a": KeyLimit(1, 2),
        "b": KeyLimit(None, 3),
    }
    for bad in ("a", "a:rpm=x", "a:qps=1", "a:rpm=1;a:tpm=2"):
        with pytest.raises(ValueError, match="key limit"):
            parse_key_limits(bad)
