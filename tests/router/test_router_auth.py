"""Who may talk to whom: API keys at the router (several, from the setting and a file) and
the cluster token on every call the router makes to a node."""

from __future__ import annotations

from pathlib import Path

import anyio.to_thread
import httpx
import pytest
from router_fakes import ANSWER, FakeNode, fake_cluster

from models.tokenizer import Tokenizer
from router.settings import RouterSettings

IDS = {"model": "smollm2", "prompt": [1, 2, 3, 4]}
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Capital of France?"}]}
TOKEN = "cluster-token-0123456789abcdef"
pytestmark = pytest.mark.timeout(60)


def _nodes(script: list[int], token: str | None) -> list[FakeNode]:
    return [
        FakeNode("p0", "prefill", script, token=token),
        FakeNode("d0", "decode", script, token=token),
    ]


async def test_every_configured_api_key_works_and_others_get_401(
    tokenizer: Tokenizer, script: list[int], tmp_path: Path
) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("# team keys\nkey-three\n\nkey-four\n")
    settings = {"api_key": "key-one, key-two", "api_key_file": key_file}
    async with (
        fake_cluster(tokenizer, _nodes(script, None), **settings) as c,
        httpx.AsyncClient(base_url=c.router_url) as client,
    ):
        for key in ("key-one", "key-two", "key-three", "key-four"):
            resp = await client.post(
                "/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"}
            )
            assert resp.status_code == 200, key
            assert resp.json()["choices"][0]["message"]["content"] == ANSWER
        for headers in ({}, {"Authorization": "Bearer key"}, {"Authorization": "key-one"}):
            resp = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
            assert resp.status_code == 401
            error = resp.json()["error"]
            assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
            assert set(error) == {"message", "type", "param", "code"}
        assert (await client.get("/health")).status_code == 200  # probes need no key


async def test_a_request_needs_no_worker_thread(tokenizer: Tokenizer, script: list[int]) -> None:
    """The key check and the nodes' checks are coroutines, not FastAPI thread-pool calls: a
    request is answered while every worker thread of the pool is taken."""
    limiter = anyio.to_thread.current_default_thread_limiter()
    holders = [object() for _ in range(int(limiter.total_tokens))]
    for holder in holders:
        await limiter.acquire_on_behalf_of(holder)
    try:
        async with (
            fake_cluster(tokenizer, _nodes(script, None), api_key="key-one") as c,
            httpx.AsyncClient(base_url=c.router_url) as client,
        ):
            headers = {"Authorization": "Bearer key-one"}
            resp = await client.post("/v1/completions", json=IDS, headers=headers)
    finally:
        for holder in holders:
            limiter.release_on_behalf_of(holder)
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == ANSWER


def test_a_missing_or_empty_key_file_fails_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read the API key file"):
        RouterSettings(api_key_file=tmp_path / "absent")
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no key"):
        RouterSettings(api_key_file=tmp_path / "empty")
    with pytest.raises(ValueError, match="at least 16 characters"):
        RouterSettings(cluster_token="short")


async def test_the_router_sends_the_cluster_token_to_nodes(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    nodes = _nodes(script, TOKEN)
    async with (
        fake_cluster(tokenizer, nodes, cluster_token=TOKEN) as c,
        httpx.AsyncClient(base_url=c.router_url) as client,
    ):
        resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == ANSWER
    assert [n.unauthorized for n in nodes] == [0, 0]
    assert len(nodes[0].prefills) == 1 and len(nodes[1].decodes) == 1


async def test_a_router_with_the_wrong_token_answers_503_not_400(
    tokenizer: Tokenizer, script: list[int]
) -> None:
    nodes = _nodes(script, TOKEN)
    async with (
        fake_cluster(tokenizer, nodes, cluster_token="not-the-cluster-token-000") as c,
        httpx.AsyncClient(base_url=c.router_url) as client,
    ):
        resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status_code == 503  # the cluster is misconfigured; the request is fine
    assert resp.json()["error"]["type"] == "server_error"
    assert nodes[0].unauthorized >= 1 and not nodes[0].prefills
