"""Sending one request of a chaos run and writing down everything that came back: the status,
each choice's tokens (from its logprobs) in the order they streamed, the finish reasons, an
error body or SSE error event, and the times (first token, end). A request that has not
ended `GRACE_S` past its deadline is cut off and marked hung."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.chaos.workload import Spec

GRACE_S = 10.0  # past the request's deadline before the client calls it hung
GATE_POLL_S = 0.05
REFUSED_PAUSE_S = 1.0  # after a refused connection (a router restarting), before the next


@dataclass
class Outcome:
    """What one request got. `tokens[i]` / `texts[i]` / `finish[i]`: choice i."""

    index: int
    started: float
    ended: float = 0.0
    status: int | None = None
    tokens: list[list[str]] = field(default_factory=list)
    alternatives: list[list[dict[str, float]]] = field(default_factory=list)  # per token: top 2
    texts: list[str] = field(default_factory=list)
    finish: list[str | None] = field(default_factory=list)
    error: dict[str, Any] | None = None  # the error body (HTTP or SSE)
    broken: str | None = None  # a transport failure, or a stream that ended without [DONE]
    refused: str | None = None  # no connection to the router: nothing was sent
    hung: bool = False
    ttft_s: float | None = None  # streamed requests: the first chunk with a token
    second_s: float | None = None  # and the second token

    def choice(self, index: int) -> int:
        while len(self.tokens) <= index:
            self.tokens.append([])
            self.alternatives.append([])
            self.texts.append("")
            self.finish.append(None)
        return index


async def send(http: httpx.AsyncClient, base_url: str, spec: Spec, deadline_s: float) -> Outcome:
    """Send `spec` with the router deadline `deadline_s`; never raises."""
    out = Outcome(spec.index, time.monotonic())
    body = spec.with_timeout(deadline_s)
    try:
        async with asyncio.timeout(deadline_s + GRACE_S):
            if spec.stream:
                await _streamed(http, base_url + spec.path, body, spec.chat, out)
            else:
                await _whole(http, base_url + spec.path, body, spec.chat, out)
    except TimeoutError:
        out.hung = True
    except httpx.ConnectError as exc:
        out.refused = f"{type(exc).__name__}: {exc}"
        await asyncio.sleep(REFUSED_PAUSE_S)  # a client backs off (else it burns its requests)
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        out.broken = f"{type(exc).__name__}: {exc}"
    out.ended = time.monotonic()
    return out


async def _whole(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], chat: bool, out: Outcome
) -> None:
    resp = await http.post(url, json=body)
    out.status = resp.status_code
    data = resp.json()
    if resp.status_code != 200:
        out.error = data.get("error", data)
        return
    for choice in data["choices"]:
        _take(out, choice, chat, whole=True)


async def _streamed(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], chat: bool, out: Outcome
) -> None:
    async with http.stream("POST", url, json=body) as resp:
        out.status = resp.status_code
        if resp.status_code != 200:
            data = json.loads(await resp.aread())
            out.error = data.get("error", data)
            return
        done = False
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            event = json.loads(line[6:])
            if "error" in event:
                out.error = event["error"]
                continue
            for choice in event["choices"]:
                _take(out, choice, chat, whole=False)
        if not done:
            out.broken = "the stream ended without [DONE]"


def _take(out: Outcome, choice: dict[str, Any], chat: bool, whole: bool) -> None:
    i = out.choice(int(choice.get("index", 0)))
    new = _tokens(choice.get("logprobs"), chat)
    if new and not whole:
        _clock(out, len(out.tokens[i]) + len(new))
    out.tokens[i] += [token for token, _ in new]
    out.alternatives[i] += [top for _, top in new]
    if chat:
        part = choice.get("message" if whole else "delta") or {}
        out.texts[i] += part.get("content") or ""
    else:
        out.texts[i] += choice.get("text") or ""
    if choice.get("finish_reason") is not None:
        out.finish[i] = choice["finish_reason"]


def _clock(out: Outcome, tokens: int) -> None:
    """Note the first and second token's times (of any choice)."""
    now = time.monotonic() - out.started
    if out.ttft_s is None:
        out.ttft_s = now
    if tokens >= 2 and out.second_s is None:
        out.second_s = now


def _tokens(logprobs: dict[str, Any] | None, chat: bool) -> list[tuple[str, dict[str, float]]]:
    """Each token with its best alternatives ({token: logprob})."""
    if not logprobs:
        return []
    if chat:
        return [
            (str(e["token"]), {str(t["token"]): float(t["logprob"]) for t in e["top_logprobs"]})
            for e in logprobs.get("content") or []
        ]
    tops = logprobs.get("top_logprobs") or []
    return [(str(t), dict(top or {})) for t, top in zip(logprobs["tokens"], tops, strict=True)]


class Gate:
    """Lets requests start (open) or holds new ones back (closed), from any thread; counts the
    requests in flight and those ended. Once stopped, no request starts any more."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self._open.set()
        self.in_flight = 0
        self.done = 0
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    async def wait_open(self) -> None:
        while not self._open.is_set():
            await asyncio.sleep(GATE_POLL_S)


async def run_all(
    base_url: str,
    specs: Sequence[Spec],
    concurrency: int,
    deadline_s: float,
    gate: Gate | None = None,
    starts: Sequence[float] | None = None,
) -> list[Outcome]:
    """Every spec in order, each started once `gate` is open, at most `concurrency` at a time,
    until the gate stops; with `starts` (seconds from the first), not before its own time (an
    open loop: a request whose time has come waits only for a free slot). The outcomes of
    those sent, by spec order."""
    outcomes: dict[int, Outcome] = {}
    gate = gate or Gate()
    slots = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=None, trust_env=False, limits=limits) as http:

        async def one(spec: Spec) -> None:
            try:
                outcomes[spec.index] = await send(http, base_url, spec, deadline_s)
            finally:
                gate.in_flight -= 1
                gate.done += 1
                slots.release()

        tasks = []
        first = time.monotonic()
        for i, spec in enumerate(specs):
            if starts is not None:
                await asyncio.sleep(max(0.0, first + starts[i] - time.monotonic()))
            await gate.wait_open()
            await slots.acquire()
            if gate.stopped:
                break
            gate.in_flight += 1
            tasks.append(asyncio.create_task(one(spec)))
        await asyncio.gather(*tasks)
    return [outcomes[s.index] for s in specs if s.index in outcomes]
