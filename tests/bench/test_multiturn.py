"""The multiturn workload: growing conversations on a shared system prompt, each user's turns
in order, and the count of prompt tokens the server computed."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import socket
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from bench import serve
from bench.multiturn import Multiturn, parse_lengths, prefix_summary, run_conversations
from bench.serve_client import LoadOptions, Target
from bench.workloads import Lengths

SHAPE = Multiturn(users=3, turns=4, system=40, think_s=0.01)
CACHED = 16  # the fake server reports this many prompt tokens from its cache


def test_conversations_grow_from_one_system_prompt() -> None:
    convs = SHAPE.conversations(seed=3, vocab_size=1000)
    assert convs == SHAPE.conversations(seed=3, vocab_size=1000)
    assert convs != SHAPE.conversations(seed=4, vocab_size=1000)
    system = convs[0][0].prompt_ids[:40]
    for turns in convs:
        assert [t.index for t in turns] == [turns[0].index + k for k in range(4)]
        assert turns[0].prompt_ids[:40] == system
        for prev, nxt in itertools.pairwise(turns):
            # the next prompt: the previous one, a stand-in answer as long as asked, a question
            assert nxt.prompt_ids[: len(prev.prompt_ids)] == prev.prompt_ids
            new = len(nxt.prompt_ids) - len(prev.prompt_ids) - prev.max_tokens
            assert SHAPE.question.low <= new <= SHAPE.question.high
    assert convs[0][1].prompt_ids[40:] != convs[1][1].prompt_ids[40:]


def _fake() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()

        async def events() -> AsyncIterator[str]:
            await asyncio.sleep(0.005)
            for _ in range(body["max_tokens"]):
                yield "data: " + json.dumps({"choices": [{"index": 0, "text": " x"}]}) + "\n\n"
            usage = {
                "prompt_tokens": len(body["prompt"]),
                "completion_tokens": body["max_tokens"],
                "prompt_tokens_details": {"cached_tokens": CACHED},
            }
            yield "data: " + json.dumps({"choices": [], "usage": usage}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@asynccontextmanager
async def _serving(app: FastAPI) -> AsyncIterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


async def test_each_user_waits_for_its_answer_and_the_computed_tokens_add_up() -> None:
    async with _serving(_fake()) as url:
        run = await run_conversations(
            Target(url, "m"), SHAPE, 3, 1000, rate=None, opts=LoadOptions(30, progress=False),
            desc="t",
        )  # fmt: skip
    assert [r.id for r in run.records] == list(range(12)) and all(r.ok for r in run.records)
    for user in range(3):
        turns = run.records[user * 4 : user * 4 + 4]
        assert all(b.start >= a.end for a, b in itertools.pairwise(turns))
    summary = prefix_summary([r.to_dict() for r in run.records])
    sent = sum(len(t.prompt_ids) for c in SHAPE.conversations(3, 1000) for t in c)
    assert summary["prompt_tokens"] == sent
    assert summary["computed_prompt_tokens"] == sent - 12 * CACHED


def test_bench_serve_runs_the_multiturn_workload(tmp_path: Path) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(_fake(), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        argv = ["--url", url, "--model", "m", "--workload", "multiturn", "--users", "2"]
        argv += ["--turns", "3", "--think-time", "0", "--rate", "inf", "--warmup", "0"]
        argv += ["--no-progress", "--out", str(tmp_path / "m.json")]
        assert serve.main(argv) == 0
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
    point = json.loads((tmp_path / "m.json").read_text())["points"][0]
    assert len(point["records"]) == 6 and point["summary"]["completed"] == 6
    assert point["summary"]["prefix"]["cached_tokens"] == 6 * CACHED


def test_turn_lengths_come_from_the_command_line() -> None:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    argv = ["--workload", "multiturn", "--question-tokens", "8:24"]
    args = parser.parse_args([*argv, "--answer-tokens", "64:384:lognormal"])
    shape = serve.config_from_args(args).multiturn
    assert shape is not None
    assert shape.question == Lengths(8, 24) and shape.answer == Lengths(64, 384, "lognormal")
    for bad in ("64", "0:10", "10:5", "8:24:gamma", "a:b"):
        with pytest.raises(argparse.ArgumentTypeError, match="bad lengths"):
            parse_lengths(bad)
