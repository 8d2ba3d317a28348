"""`splitserve up` with 1 prefill + 1 decode node, driven by the official openai client.

Greedy answers equal the engine's offline output on both paths (KV over NIXL, and local
prefill for short prompts); bad input gets OpenAI-style 4xx; a client that leaves cancels
its decode; a decode node killed mid-stream ends the stream with an error within seconds and
drops out of the registry; Ctrl-C leaves no process behind. Tests run in file order on one
cluster: the last two break it on purpose.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
from cluster_harness import Cluster, alive, running_cluster
from oracle import Expected, Oracle

from cluster.registry import node_key

pytestmark = pytest.mark.e2e

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Name three colors."}],
]
LONG_PROMPT = (
    "The history of Paris spans more than two thousand years. It began as a small settlement "
    "on an island in the Seine and grew into the capital of France. Today the city is known for"
)
SHORT_PROMPT = "The capital of France is"  # fewer tokens than the router's local-prefill limit


@pytest.fixture(scope="module")
def cluster(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    run_dir = tmp_path_factory.mktemp("up-1x1")
    with running_cluster(default_model_dir, run_dir, "--num-kv-blocks", "128") as up:
        yield up


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> openai.OpenAI:
    return cluster.openai_client()


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def _check(text: str, usage: Any, reason: str | None, want: Expected) -> None:
    assert text == want.text
    assert reason == want.finish_reason
    assert usage.prompt_tokens == want.prompt_tokens
    assert usage.completion_tokens == want.completion_tokens


def test_chat_equals_the_offline_engine(client: openai.OpenAI, model: str, oracle: Oracle) -> None:
    for chat, want in zip(CHATS, oracle.chat(CHATS, max_tokens=16), strict=True):
        plain = client.chat.completions.create(
            model=model,
            messages=chat,
            max_tokens=16,
            temperature=0,  # type: ignore[arg-type]
        )
        choice = plain.choices[0]
        _check(choice.message.content or "", plain.usage, choice.finish_reason, want)
        stream = client.chat.completions.create(
            model=model, messages=chat, max_tokens=16, temperature=0,  # type: ignore[arg-type]
            stream=True, stream_options={"include_usage": True},
        )  # fmt: skip
        text, reason, usage = "", None, None
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                reason = chunk.choices[0].finish_reason or reason
            usage = chunk.usage or usage
        _check(text, usage, reason, want)


def _counters(cluster: Cluster) -> tuple[float, float]:
    """(prefill requests, decode local prefills) so far."""
    prefill = cluster.stats("prefill-0").counters.get("requests_total", 0)
    local = cluster.stats("decode-0").counters.get("local_prefills_total", 0)
    return prefill, local


@pytest.mark.parametrize(("prompt", "path"), [(LONG_PROMPT, "remote"), (SHORT_PROMPT, "local")])
def test_completions_equal_the_offline_engine_on_both_paths(
    client: openai.OpenAI, model: str, oracle: Oracle, cluster: Cluster, prompt: str, path: str
) -> None:
    want = oracle.complete([prompt], max_tokens=12)[0]
    before = _counters(cluster)
    plain = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0)
    _check(plain.choices[0].text, plain.usage, plain.choices[0].finish_reason, want)
    stream = client.completions.create(
        model=model, prompt=prompt, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    text, reason, usage = "", None, None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].text
            reason = chunk.choices[0].finish_reason or reason
        usage = chunk.usage or usage
    _check(text, usage, reason, want)
    prefills, locals_ = (a - b for a, b in zip(_counters(cluster), before, strict=True))
    assert (prefills, locals_) == ((2, 0) if path == "remote" else (0, 2))


BAD_REQUESTS: list[tuple[str, Any]] = [
    ("/v1/chat/completions", {"model": "MODEL", "messages": []}),
    ("/v1/chat/completions", {"model": "MODEL", "messages": "hi"}),
    ("/v1/chat/completions", {"model": "no-such-model", "messages": CHATS[0]}),
    ("/v1/chat/completions", {"model": "MODEL", "messages": CHATS[0], "max_tokens": 0}),
    ("/v1/chat/completions", {"model": "MODEL", "messages": CHATS[0], "temperature": -1}),
    ("/v1/chat/completions", {"model": "MODEL", "messages": CHATS[0], "top_p": 7}),
    ("/v1/completions", {"model": "MODEL", "prompt": ""}),
    ("/v1/completions", {"model": "MODEL", "prompt": [10**9]}),
    ("/v1/completions", {"model": "MODEL", "prompt": "word " * 9000}),
    ("/v1/completions", {"model": "MODEL", "prompt": "hi", "max_tokens": 10**7}),
    ("/v1/completions", "{not json"),
]


def test_bad_input_answers_4xx_with_an_openai_error(cluster: Cluster, model: str) -> None:
    with httpx.Client(base_url=cluster.base_url, timeout=30, trust_env=False) as http:
        for path, body in BAD_REQUESTS:
            raw = body if isinstance(body, str) else json.dumps(body).replace("MODEL", model)
            resp = http.post(path, content=raw, headers={"content-type": "application/json"})
            assert 400 <= resp.status_code < 500, (body, resp.status_code, resp.text)
            error = resp.json()["error"]
            assert {"message", "type", "param", "code"} <= set(error), error
            assert error["message"]


def _sse_stream(http: httpx.Client, model: str, max_tokens: int) -> Any:
    body = {
        "model": model, "prompt": LONG_PROMPT, "max_tokens": max_tokens, "temperature": 0,
        "stream": True, "ignore_eos": True,
    }  # fmt: skip
    return http.stream("POST", "/v1/completions", json=body)


def test_client_disconnect_cancels_the_decode(cluster: Cluster, model: str) -> None:
    before = cluster.stats("decode-0").counters["generated_tokens"]
    with (
        httpx.Client(base_url=cluster.base_url, timeout=60, trust_env=False) as http,
        _sse_stream(http, model, max_tokens=400) as resp,
    ):
        lines = resp.iter_lines()
        assert next(lines).startswith("data: ")
        assert next(line for line in lines if line.startswith("data: "))
    idle = cluster.wait_idle(["prefill-0", "decode-0"])
    for name, stats in idle.items():
        assert stats.load.free_blocks == stats.load.total_blocks, name
        assert (stats.load.running, stats.load.leases_held) == (0, 0), name
    assert idle["decode-0"].counters["generated_tokens"] - before < 300  # it stopped early


def test_killed_decode_node_ends_the_stream_and_leaves_the_registry(
    cluster: Cluster, model: str
) -> None:
    with httpx.Client(base_url=cluster.base_url, timeout=60, trust_env=False) as http:
        with _sse_stream(http, model, max_tokens=2000) as resp:
            lines = resp.iter_lines()
            assert next(lines).startswith("data: ")
            os.kill(cluster.pids["decode-0"], signal.SIGKILL)
            killed_at = time.monotonic()
            rest = [line for line in lines if line.startswith("data: ")]
            ended_after = time.monotonic() - killed_at
        assert ended_after < 10, f"the stream ended {ended_after:.1f}s after the kill"
        assert rest[-1] == "data: [DONE]"
        assert "error" in json.loads(rest[-2].removeprefix("data: "))
        # the router forgets the node once its registry key expires (ttl_s 5 s, polled every
        # 1 s): new requests never go there again
        store = redis.Redis.from_url(cluster.layout["redis"])

        def forgotten() -> bool:
            gone = store.get(node_key("decode-0")) is None
            return gone and http.get("/ready").json()["decode_nodes"] == 0

        deadline = killed_at + 5 + 1 + 3
        while not forgotten() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert forgotten()
        assert http.get("/ready").json()["prefill_nodes"] == 1
        refused = http.post(
            "/v1/completions", json={"model": model, "prompt": SHORT_PROMPT, "max_tokens": 4}
        )
        assert refused.status_code == 503 and refused.json()["error"]["message"]


def test_ctrl_c_stops_every_process(cluster: Cluster) -> None:
    started = time.monotonic()
    assert cluster.stop() == 0
    assert time.monotonic() - started < 30
    left = [name for name, pid in cluster.pids.items() if alive(pid)]
    assert left == [], f"still running after Ctrl-C: {left}"
    assert "stopped" in cluster.output()
