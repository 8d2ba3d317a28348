"""Usage per API key: what `/v1/usage` and /metrics count by key name equals the `usage` the
responses reported, summed; a key over its requests-per-minute limit gets 429 with
Retry-After before any node is called, and other keys are unaffected."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from router_fakes import FakeNode, fake_cluster, metric

from models.tokenizer import Tokenizer
from router.settings import RouterSettings

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Capital of France?"}]}
KEYS = "alice:key-alice\nbob:key-bob\nops:key-ops\n"
pytestmark = pytest.mark.timeout(60)


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer key-{key}"}


def _nodes(script: list[int]) -> list[FakeNode]:
    return [FakeNode("p0", "prefill", script), FakeNode("d0", "decode", script)]


def _stream_usage(text: str) -> dict[str, Any]:
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    usage: dict[str, Any] = chunks[-1]["usage"]
    return usage


async def test_usage_by_key_equals_the_responses_usage_summed(
    tokenizer: Tokenizer, script: list[int], tmp_path: Path
) -> None:
    (tmp_path / "keys").write_text(KEYS)
    settings = {"api_key_file": tmp_path / "keys", "usage_admin_keys": "ops"}
    seen: dict[str, list[dict[str, Any]]] = {"alice": [], "bob": []}
    async with (
        fake_cluster(tokenizer, _nodes(script), **settings) as c,
        httpx.AsyncClient(base_url=c.router_url) as client,
    ):
        for who, body in [
            ("alice", CHAT),
            ("alice", CHAT | {"max_tokens": 3}),
            ("bob", CHAT | {"n": 2}),
        ]:
            resp = await client.post("/v1/chat/completions", json=body, headers=_auth(who))
            assert resp.status_code == 200, resp.text
            seen[who].append(resp.json()["usage"])
        stream = CHAT | {"stream": True, "stream_options": {"include_usage": True}}
        resp = await client.post("/v1/chat/completions", json=stream, headers=_auth("bob"))
        seen["bob"].append(_stream_usage(resp.text))
        assert (await client.get("/v1/usage", headers=_auth("alice"))).status_code == 403
        report = (await client.get("/v1/usage", headers=_auth("ops"))).json()["data"]
        text = (await client.get("/metrics")).text
    by_key = {row["key"]: row for row in report}
    assert set(by_key) == {"alice", "bob"}
    for who, usages in seen.items():
        row = by_key[who]
        assert row["requests"] == len(usages)
        for field in ("prompt_tokens", "completion_tokens", "total_tokens"):
            assert row[field] == sum(u[field] for u in usages), (who, field)
        cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
        assert row["cached_tokens"] == cached
        completion = metric(text, "splitserve_router_key_completion_tokens_total", key=who)
        assert completion == row["completion_tokens"]
        assert metric(text, "splitserve_router_key_requests_total", key=who) == len(usages)
    assert "key-alice" not in text and "key-alice" not in json.dumps(report)


async def test_a_key_over_its_limit_gets_429_and_others_do_not(
    tokenizer: Tokenizer, script: list[int], tmp_path: Path
) -> None:
    (tmp_path / "keys").write_text(KEYS)
    settings = {"api_key_file": tmp_path / "keys", "key_limits": "alice:rpm=2"}
    nodes = _nodes(script)
    async with (
        fake_cluster(tokenizer, nodes, **settings) as c,
        httpx.AsyncClient(base_url=c.router_url) as client,
    ):
        for _ in range(2):
            ok = await client.post("/v1/chat/completions", json=CHAT, headers=_auth("alice"))
            assert ok.status_code == 200
        over = await client.post("/v1/chat/completions", json=CHAT, headers=_auth("alice"))
        for _ in range(3):
            bob = await client.post("/v1/chat/completions", json=CHAT, headers=_auth("bob"))
            assert bob.status_code == 200
        text = (await client.get("/metrics")).text
    assert over.status_code == 429
    assert 1 <= int(over.headers["Retry-After"]) <= 60
    assert over.json()["error"]["code"] == "rate_limit_exceeded"
    assert len(nodes[0].prefills) == 5  # the refused request reached no node
    limited = metric(text, "splitserve_router_key_rate_limited_total", key="alice", limit="rpm")
    assert limited == 1


def test_key_names_and_limits_are_checked_at_start(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(KEYS)
    with pytest.raises(ValueError, match="no API key is named carol"):
        RouterSettings(api_key_file=keys, key_limits="carol:rpm=1")
    with pytest.raises(ValueError, match="no API key is named carol"):
        RouterSettings(api_key_file=keys, usage_admin_keys="carol")
    with pytest.raises(ValueError, match="rpm=N or tpm=N"):
        RouterSettings(api_key_file=keys, key_limits="alice:rpm=0")
    keys.write_text("alice:one\nalice:two\n")
    with pytest.raises(ValueError, match="two API keys are named 'alice'"):
        RouterSettings(api_key_file=keys)
    keys.write_text("bad name:secret\n")
    with pytest.raises(ValueError, match="key 1") as err:
        RouterSettings(api_key_file=keys)
    assert "secret" not in str(err.value)
    keys.write_text("k3\nteam:k4\n")
    names = [k.name for k in RouterSettings(api_key="k1,k2", api_key_file=keys).api_keys()]
    assert names == ["key-1", "key-2", "key-3", "team"]
