"""POST /v1/embeddings through the router, over fake nodes: each input goes to the prefill
pool (never a decode node) with the pooling asked for, in order; float and base64; usage in
OpenAI's shape, charged to the key; API keys and key limits apply; bad input gets OpenAI's
error naming the field; without a prefill pool the decode nodes serve it; a failed node
is retried elsewhere."""

from __future__ import annotations

import base64
import struct
from pathlib import Path

import httpx
import openai
import pytest
from router_fakes import FakeNode, fake_cluster

from models.tokenizer import Tokenizer

pytestmark = pytest.mark.timeout(60)
BODY = {"model": "smollm2", "input": ["Hello there", "General Kenobi"]}


def _nodes(script: list[int]) -> list[FakeNode]:
    return [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]


async def test_inputs_go_to_the_prefill_pool_in_order(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    nodes = _nodes(script)
    async with fake_cluster(tokenizer, nodes, pooling_type="mean") as c:
        client = openai.AsyncOpenAI(base_url=c.router_url + "/v1", api_key="x", max_retries=0)
        # the SDK asks for base64 by default and decodes it
        got = await client.embeddings.create(model="smollm2", input=BODY["input"])
        ids = [tokenizer.encode(t, True) for t in BODY["input"]]
        assert [d.embedding for d in got.data] == [[len(i), i[0], 0.0, 1.0] for i in ids]
        assert [d.index for d in got.data] == [0, 1]
        n = sum(len(i) for i in ids)
        assert (got.usage.prompt_tokens, got.usage.total_tokens) == (n, n)
        assert [(e.pooling, e.normalize) for e in nodes[0].embeds] == [("mean", True)] * 2
        assert nodes[1].decodes == [] and nodes[0].prefills == []
        raw = await client.embeddings.create(
            model="smollm2", input=[[7, 8, 9]], encoding_format="base64",
            extra_body={"pooling_type": "last", "normalize": False},
        )  # fmt: skip
        packed = base64.b64decode(str(raw.data[0].embedding))  # asked for: left encoded
        assert struct.unpack("<4f", packed) == (3.0, 7.0, 0.0, 1.0)
        assert nodes[0].embeds[-1].pooling == "last" and not nodes[0].embeds[-1].normalize
        async with httpx.AsyncClient(base_url=c.router_url) as http:
            resp = await http.post("/v1/embeddings", json={"model": "smollm2", "input": [7]})
        assert resp.json()["data"][0]["embedding"] == [1.0, 7.0, 0.0, 1.0]  # float by default


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": ""}, "input"),
        ({"input": ["a", ""]}, "input"),
        ({"input": [-1]}, "input"),
        ({"input": [[1], [10**6]]}, "input[1]"),
        ({"input": "a", "dimensions": 3}, "dimensions"),
        ({"input": "a", "dimensions": 0}, "dimensions"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "a", "pooling_type": "cls"}, "pooling_type"),
        ({"input": "a", "model": "other"}, "model"),
        ({"input": "word " * 300}, "input"),
        ({}, "input"),
    ],
)
async def test_bad_input_names_the_field(
    tokenizer: Tokenizer, script: list[int], body: dict[str, object], param: str
) -> None:
    async with (
        fake_cluster(tokenizer, _nodes(script)) as c,
        httpx.AsyncClient(base_url=c.router_url) as client,
    ):
        resp = await client.post("/v1/embeddings", json={"model": "smollm2"} | body)
    assert 400 <= resp.status_code < 500, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


async def test_keys_limits_and_usage_apply(
    tokenizer: Tokenizer, script: list[int], tmp_path: Path
) -> None:
    (tmp_path / "keys").write_text("alice:key-alice\nops:key-ops\n")
    settings = {
        "api_key_file": tmp_path / "keys", "usage_admin_keys": "ops",
        "key_limits": "alice:rpm=2",
    }  # fmt: skip
    async with (
        fake_cluster(tokenizer, _nodes(script), **settings) as c,
        httpx.AsyncClient(base_url=c.router_url) as client,
    ):
        url, alice = "/v1/embeddings", {"Authorization": "Bearer key-alice"}
        assert (await client.post(url, json=BODY)).status_code == 401
        answers = [await client.post(url, json=BODY, headers=alice) for _ in range(3)]
        assert [r.status_code for r in answers] == [200, 200, 429]
        ops = {"Authorization": "Bearer key-ops"}
        report = (await client.get("/v1/usage", headers=ops)).json()["data"]
    usage = {u["key"]: u for u in report}["alice"]
    assert usage["requests"] == 2
    assert usage["prompt_tokens"] == 2 * answers[0].json()["usage"]["prompt_tokens"]
    assert usage["completion_tokens"] == 0


async def test_without_a_prefill_pool_decode_nodes_serve_and_a_failed_node_is_retried(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    decode = FakeNode("d0", "decode", script)
    async with (
        fake_cluster(tokenizer, [decode]) as c,
        httpx.AsyncClient(base_url=c.router_url) as client,
    ):
        assert (await client.post("/v1/embeddings", json=BODY)).status_code == 200
    assert len(decode.embeds) == 2
    bad = FakeNode("p0", "prefill", script, prefill_status=500)
    good = FakeNode("p1", "prefill", script)
    nodes = [bad, good, FakeNode("d0", "decode", script)]
    async with (
        fake_cluster(tokenizer, nodes) as c,
        httpx.AsyncClient(base_url=c.router_url) as client,
    ):
        for _ in range(3):
            assert (await client.post("/v1/embeddings", json=BODY)).status_code == 200
    assert len(good.embeds) == 6 and nodes[2].embeds == []
