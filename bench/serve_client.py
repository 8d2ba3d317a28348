"""The serving benchmark's client: one streamed /v1/completions request -> one RequestRecord,
and a sweep point of Poisson arrivals run against an OpenAI-compatible server.

Times are `time.perf_counter()` (monotonic) seconds from the start of the sweep point. A
request's first token is its first streamed chunk carrying text; its output token count comes
from the usage chunk (`stream_options.include_usage`), else from the number of text chunks.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import httpx
from tqdm import tqdm

from bench.workloads import RequestSpec


class Unreachable(Exception):
    """The server did not answer at all (connection refused, DNS, connect timeout)."""


class _ServerError(Exception):
    """An HTTP error status or an error event inside the stream."""


@dataclass(frozen=True)
class Target:
    """Where requests go. `base_url` has no trailing `/v1`."""

    base_url: str
    model: str
    api_key: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def normalize_base_url(url: str) -> str:
    return url.rstrip("/").removesuffix("/v1")


async def discover_model(base_url: str, model: str | None, api_key: str | None) -> Target:
    """Check the server answers; the model is `model` or the first one it lists."""
    headers = Target(base_url, "", api_key).headers
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            resp = await client.get(f"{base_url}/v1/models", headers=headers)
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadTimeout) as exc:
        raise Unreachable(f"cannot reach {base_url}: {exc or type(exc).__name__}") from None
    if model is not None:
        return Target(base_url, model, api_key)
    if resp.status_code != 200:
        raise Unreachable(f"GET {base_url}/v1/models answered {resp.status_code}; pass --model")
    data = resp.json().get("data") or []
    if not data:
        raise Unreachable(f"{base_url}/v1/models lists no model; pass --model")
    return Target(base_url, str(data[0]["id"]), api_key)


@dataclass(frozen=True)
class RequestRecord:
    """One request's timeline (seconds from its sweep point's start) and outcome."""

    id: int
    kind: str
    prompt_tokens: int
    max_tokens: int
    scheduled: float  # when the arrival process wanted it sent
    start: float  # when it was sent (after any concurrency cap)
    first_token_time: float | None
    token_times: tuple[float, ...]  # arrival of each chunk carrying text
    end: float
    output_tokens: int
    error: str | None
    cached_tokens: int | None = None  # prompt tokens the server took from a prefix cache

    @property
    def ok(self) -> bool:
        return self.error is None and self.first_token_time is not None

    @property
    def ttft(self) -> float | None:
        if not self.ok or self.first_token_time is None:
            return None
        return self.first_token_time - self.start

    @property
    def tpot(self) -> float | None:
        """DistServe: (last token time - first token time) / (output tokens - 1)."""
        if not self.ok or self.output_tokens < 2 or self.first_token_time is None:
            return None
        return (self.token_times[-1] - self.first_token_time) / (self.output_tokens - 1)

    @property
    def itl(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)] if self.ok else []

    @property
    def e2e(self) -> float | None:
        return self.end - self.start if self.ok else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "prompt_tokens": self.prompt_tokens,
            "max_tokens": self.max_tokens,
            "output_tokens": self.output_tokens,
            "scheduled": self.scheduled,
            "start": self.start,
            "first_token_time": self.first_token_time,
            "token_times": list(self.token_times),
            "end": self.end,
            "ttft": self.ttft,
            "tpot": self.tpot,
            "itl": self.itl,
            "e2e": self.e2e,
            "error": self.error,
            "cached_tokens": self.cached_tokens,
        }


class Clock:
    """Monotonic seconds since construction."""

    def __init__(self) -> None:
        self._t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._t0


@dataclass
class _Timeline:
    start: float
    token_times: list[float] = field(default_factory=list)
    usage_tokens: int | None = None
    cached_tokens: int | None = None
    done: bool = False


def _request_body(target: Target, spec: RequestSpec) -> dict[str, Any]:
    return {
        "model": target.model,
        "prompt": spec.prompt_ids,
        "max_tokens": spec.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _error_text(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])[:200]
    except (ValueError, KeyError, TypeError):
        return body.decode(errors="replace")[:200]


def _on_event(event: dict[str, Any], now: float, line: _Timeline) -> None:
    if "error" in event:
        err = event["error"]
        raise _ServerError(str(err.get("message", err) if isinstance(err, dict) else err)[:200])
    if any(choice.get("text") for choice in event.get("choices") or []):
        line.token_times.append(now)
    usage = event.get("usage")
    if usage:
        line.usage_tokens = int(usage["completion_tokens"])
        details = usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            line.cached_tokens = int(details["cached_tokens"])


async def _consume(
    client: httpx.AsyncClient, target: Target, spec: RequestSpec, clock: Clock, line: _Timeline
) -> None:
    url = f"{target.base_url}/v1/completions"
    body = _request_body(target, spec)
    async with client.stream("POST", url, json=body, headers=target.headers) as resp:
        if resp.status_code != 200:
            raise _ServerError(f"HTTP {resp.status_code}: {_error_text(await resp.aread())}")
        async for raw in resp.aiter_lines():
            now = clock.now()
            if not raw.startswith("data:"):
                continue
            data = raw[5:].strip()
            if data == "[DONE]":
                line.done = True
                return
            _on_event(json.loads(data), now, line)
    raise _ServerError("stream ended without [DONE]")


async def stream_one(
    client: httpx.AsyncClient, target: Target, spec: RequestSpec, clock: Clock,
    scheduled: float, timeout_s: float,
) -> RequestRecord:  # fmt: skip
    """Send one streamed completion and time it; failures become the record's error."""
    line = _Timeline(start=clock.now())
    error: str | None = None
    try:
        async with asyncio.timeout(timeout_s):
            await _consume(client, target, spec, clock, line)
    except TimeoutError:
        error = f"timeout after {timeout_s:g} s"
    except _ServerError as exc:
        error = str(exc)
    except (httpx.HTTPError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
    if error is None and not line.token_times:
        error = "no tokens streamed"
    times = tuple(line.token_times)
    return RequestRecord(
        id=spec.index, kind=spec.kind, prompt_tokens=len(spec.prompt_ids),
        max_tokens=spec.max_tokens, scheduled=scheduled, start=line.start,
        first_token_time=times[0] if times else None, token_times=times, end=clock.now(),
        output_tokens=line.usage_tokens if line.usage_tokens is not None else len(times),
        error=error, cached_tokens=line.cached_tokens,
    )  # fmt: skip


@dataclass(frozen=True)
class LoadOptions:
    timeout_s: float = 120.0
    max_concurrency: int | None = None  # None: no cap
    progress: bool = True

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")


@dataclass(frozen=True)
class PointRun:
    records: list[RequestRecord]
    duration_s: float  # first send to last completion


async def run_point(
    target: Target, specs: list[RequestSpec], arrivals: list[float], opts: LoadOptions, desc: str
) -> PointRun:
    """Send `specs[i]` at `arrivals[i]` s (all concurrently) and collect their records."""
    if len(specs) != len(arrivals):
        raise ValueError(f"{len(specs)} requests but {len(arrivals)} arrival times")
    cap = opts.max_concurrency
    limits = httpx.Limits(max_connections=cap, max_keepalive_connections=cap or 64)
    bar = tqdm(total=len(specs), desc=desc, unit="req", file=sys.stderr, disable=not opts.progress)
    sem = asyncio.Semaphore(cap) if cap else None
    failed = 0
    clock = Clock()
    async with httpx.AsyncClient(timeout=opts.timeout_s, limits=limits) as client:

        async def one(spec: RequestSpec, at: float) -> RequestRecord:
            nonlocal failed
            await asyncio.sleep(max(0.0, at - clock.now()))
            gate: AbstractAsyncContextManager[Any] = sem if sem is not None else nullcontext()
            async with gate:
                record = await stream_one(client, target, spec, clock, at, opts.timeout_s)
            failed += not record.ok
            bar.set_postfix(failed=failed, refresh=False)
            bar.update(1)
            return record

        records = await asyncio.gather(*(one(s, a) for s, a in zip(specs, arrivals, strict=True)))
    bar.close()
    return PointRun(list(records), max((r.end for r in records), default=0.0))
