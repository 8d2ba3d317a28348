"""Fake prefill/decode nodes that speak cluster.protocol, and helpers to run apps on
localhost with real uvicorn servers inside the test's event loop."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse
from prometheus_client.parser import text_string_to_metric_families

from cluster import protocol as p
from cluster.auth import CLUSTER_TOKEN_HEADER
from cluster.node_records import NodeInfo, NodeLoad, NodeRecord
from cluster.registry import StaticMembership
from models.sampling_params import SamplingParams
from models.tokenizer import Tokenizer
from router.app import create_app
from router.settings import RouterSettings

FINGERPRINT = "fake-layout"
# What the fake nodes generate (as token ids, see the `script` fixture).
ANSWER = "The capital of France is Paris. It is a lovely city."


@asynccontextmanager
async def serving(app: Any, lifespan: Literal["on", "off"] = "off") -> AsyncIterator[str]:
    """Run `app` on a free localhost port; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", lifespan=lifespan, loop="asyncio", timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("server exited at start")
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


def dead_url() -> str:
    """A localhost URL where nothing listens (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@dataclass
class FakeNode:
    """A node that 'generates' `script` (token ids) in order, whatever the prompt.

    Decoding continues the script at len(output_token_ids). The script's last token is
    treated as EOS (finish "stop"); max_tokens ends with "length".
    """

    node_id: str
    role: p.NodeRole
    script: list[int]
    token_delay_s: float = 0.0
    die_after: int | None = None  # decode: cut the stream after this many events
    prefill_status: int = 200
    decode_status: int = 200
    busy_answers: int = 0  # decode: the first calls answered 503 (batch and queue full)
    lease_s: float = 30.0  # prefill: the KV lease's time to live
    max_model_len: int = 256
    fingerprint: str = FINGERPRINT
    url: str = ""
    gate: asyncio.Event | None = None  # decode waits for it before the first event
    gate_at: int | None = None  # with gate: it waits before the script's token at this index
    accept_gate: asyncio.Event | None = None  # decode waits for it before answering at all
    prefill_gate: asyncio.Event | None = None  # prefill waits for it before answering
    token: str | None = None  # the cluster token every /internal/* call must carry
    prefix_hit_tokens: int = 0  # decode: imported prompt tokens its own cache "held"
    unauthorized: int = 0  # calls refused for a missing or wrong token
    prefills: list[p.PrefillRequest] = field(default_factory=list)
    decodes: list[p.DecodeRequest] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)
    releases: list[str] = field(default_factory=list)
    embeds: list[p.EmbedRequest] = field(default_factory=list)
    decode_started: asyncio.Event = field(default_factory=asyncio.Event)

    def record(self, heartbeat_at: float = 1.0, waiting: int = 0) -> NodeRecord:
        info = NodeInfo(
            node_id=self.node_id,
            role=self.role,
            url=self.url,
            model="smollm2",
            layout_fingerprint=self.fingerprint,
            max_model_len=self.max_model_len,
            capacity=100,
            started_at=0.0,
        )
        return NodeRecord(info=info, load=NodeLoad(waiting=waiting), heartbeat_at=heartbeat_at)

    def app(self) -> FastAPI:
        app = FastAPI(dependencies=[Depends(self._check_token)])
        app.post(p.INTERNAL_PREFILL)(self._prefill)
        app.post(p.INTERNAL_GENERATE)(self._generate)
        app.post(p.INTERNAL_ABORT)(self._abort)
        app.post(p.INTERNAL_RELEASE)(self._release)
        app.post(p.INTERNAL_EMBED)(self._embed)
        return app

    async def _check_token(self, request: Request) -> None:
        if self.token is not None and request.headers.get(CLUSTER_TOKEN_HEADER) != self.token:
            self.unauthorized += 1
            raise HTTPException(401, "missing or wrong cluster token")

    def _lp(self, token: int, spec: SamplingParams) -> p.TokenLogprobMsg | None:
        if spec.logprobs is None:
            return None
        top = [(token, -0.5), (token + 1, -1.5), (token + 2, -2.5)][: spec.logprobs]
        return p.TokenLogprobMsg(token_id=token, logprob=-0.5, top=top)

    async def _prefill(self, req: p.PrefillRequest) -> JSONResponse:
        self.prefills.append(req)
        if self.prefill_gate is not None:
            await self.prefill_gate.wait()
        if self.prefill_status != 200:
            err = p.NodeErrorResponse(error=p.ErrorInfo(code="x", message="scripted failure"))
            return JSONResponse(err.model_dump(), status_code=self.prefill_status)
        first = self.script[0]
        done = req.sampling.max_tokens == 1 or len(self.script) == 1
        reason = ("length" if req.sampling.max_tokens == 1 else "stop") if done else None
        kv = p.KVHandle(
            node_id=self.node_id,
            peer_info="peer",
            block_ids=[0, 1],
            num_tokens=len(req.prompt_token_ids),
            layout_fingerprint=self.fingerprint,
            lease_expires_at=time.time() + self.lease_s,
        )
        resp = p.PrefillResponse(
            request_id=req.request_id,
            first_token_id=first,
            first_logprob=self._lp(first, req.sampling),
            finished=done,
            finish_reason=reason,
            num_prompt_tokens=len(req.prompt_token_ids),
            num_cached_tokens=3,
            kv=None if done else kv,
        )
        return JSONResponse(resp.model_dump())

    async def _embed(self, req: p.EmbedRequest) -> JSONResponse:
        """A vector of 4: the prompt's length, its first id, then 0 and 1."""
        self.embeds.append(req)
        if self.prefill_status != 200:
            err = p.NodeErrorResponse(error=p.ErrorInfo(code="x", message="scripted failure"))
            return JSONResponse(err.model_dump(), status_code=self.prefill_status)
        if req.dimensions not in (None, 4):
            err = p.NodeErrorResponse(
                error=p.ErrorInfo(code="bad_request", message="4 only", param="dimensions")
            )
            return JSONResponse(err.model_dump(), status_code=400)
        ids = req.prompt_token_ids
        resp = p.EmbedResponse(
            request_id=req.request_id,
            embedding=[float(len(ids)), float(ids[0]), 0.0, 1.0],
            num_prompt_tokens=len(ids),
        )
        return JSONResponse(resp.model_dump())

    async def _generate(self, req: p.DecodeRequest) -> Any:
        self.decodes.append(req)
        self.decode_started.set()
        if self.accept_gate is not None:
            await self.accept_gate.wait()
        status = self.decode_status
        if self.busy_answers > 0:
            self.busy_answers -= 1
            status = 503
        if status != 200:
            err = p.NodeErrorResponse(error=p.ErrorInfo(code="busy", message="scripted"))
            return JSONResponse(err.model_dump(), status_code=status)
        return StreamingResponse(self._events(req), media_type="application/x-ndjson")

    async def _events(self, req: p.DecodeRequest) -> AsyncIterator[bytes]:
        produced = len(req.output_token_ids)
        sent = 0
        while True:
            if self.gate is not None and (self.gate_at or len(req.output_token_ids)) == produced:
                await self.gate.wait()
            if req.request_id in self.aborts:
                yield _line(p.TokenEvent(finished=True, finish_reason="abort"))
                return
            if self.die_after is not None and sent >= self.die_after:
                raise ConnectionResetError("scripted node death")
            token = self.script[produced]
            produced += 1
            sent += 1
            last = produced >= len(self.script)
            done = last or produced >= req.sampling.max_tokens
            reason = ("stop" if last else "length") if done else None
            lp = self._lp(token, req.sampling)
            event = p.TokenEvent(
                token_ids=[token],
                logprobs=[lp] if lp else None,
                finished=done,
                finish_reason=reason,
                num_prompt_tokens=len(req.prompt_token_ids),
                num_cached_tokens=0 if req.kv is None else len(req.prompt_token_ids),
                num_prefix_hit_tokens=0 if req.kv is None else self.prefix_hit_tokens,
            )
            yield _line(event)
            if done:
                return
            await asyncio.sleep(self.token_delay_s)

    async def _abort(self, req: p.AbortRequest) -> dict[str, Any]:
        self.aborts.append(req.request_id)
        return p.ControlResponse(request_id=req.request_id, done=True).model_dump()

    async def _release(self, req: p.ReleaseRequest) -> dict[str, Any]:
        self.releases.append(req.request_id)
        return p.ControlResponse(request_id=req.request_id, done=True).model_dump()


def _line(event: p.TokenEvent) -> bytes:
    return event.model_dump_json().encode() + b"\n"


def router_settings(**overrides: Any) -> RouterSettings:
    base: dict[str, Any] = {
        "model": "smollm2",
        "local_prefill_max_tokens": 0,
        "prefill_timeout_s": 5.0,
        "decode_idle_timeout_s": 5.0,
        "connect_timeout_s": 1.0,
        "request_timeout_s": 30.0,
    }
    return RouterSettings(**(base | overrides))


@dataclass
class Cluster:
    router_url: str
    membership: StaticMembership
    app: FastAPI
    nodes: list[FakeNode]


@asynccontextmanager
async def fake_cluster(
    tokenizer: Tokenizer,
    nodes: list[FakeNode],
    extra_records: Sequence[NodeRecord] = (),
    **settings: Any,
) -> AsyncIterator[Cluster]:
    """Fake nodes + a router over them, all on real localhost HTTP."""
    async with AsyncExitStack() as stack:
        for node in nodes:
            node.url = await stack.enter_async_context(serving(node.app()))
        membership = StaticMembership([n.record() for n in nodes] + list(extra_records))
        app = create_app(router_settings(**settings), membership=membership, tokenizer=tokenizer)
        url = await stack.enter_async_context(serving(app, lifespan="on"))
        yield Cluster(url, membership, app, nodes)


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called `name` in a /metrics text whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and wanted <= set(s.labels.items())
    )
