"""The cluster token: nodes answer /internal/* and /stats (transfer metadata, memory addresses)
only with it (401 in the protocol's error format otherwise) while the probes stay open, and a
prefill node refuses the KV handshake of a reader without it."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from node_harness import (
    generate,
    metric,
    node_settings,
    offline_tokens,
    scrape,
    serving,
    tokens_of,
    wait_idle,
)

from cluster.auth import CLUSTER_TOKEN_HEADER
from cluster.protocol import DecodeRequest, NodeErrorResponse, PrefillResponse
from decode_node.app import create_app as decode_app
from models.sampling_params import SamplingParams
from prefill_node.app import create_app as prefill_app

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKEN = "the-cluster-token-0123456789"
OTHER = "another-cluster-token-98765"
PROMPT = [5, 9, 17, 33, 4, 8, 12, 40, 41]
SPEC = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
WITH_TOKEN = {CLUSTER_TOKEN_HEADER: TOKEN}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def nodes(
    model_dir: Path, redis_url: str
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """A prefill node with TOKEN and a decode node of another cluster (OTHER)."""
    prefill = node_settings(model_dir, redis_url, "prefill", cluster_token=TOKEN)
    stranger = node_settings(model_dir, redis_url, "decode", cluster_token=OTHER)
    async with (
        serving(prefill_app(prefill), prefill) as p,
        serving(decode_app(stranger), stranger) as d,
    ):
        yield p, d


def _prefill_body(rid: str) -> dict[str, object]:
    return {"request_id": rid, "prompt_token_ids": PROMPT, "sampling": dataclasses.asdict(SPEC)}


@pytest.mark.parametrize("headers", [{}, {CLUSTER_TOKEN_HEADER: "wrong-token-0123456789"}])
async def test_internal_calls_without_the_token_get_401(
    nodes: tuple[httpx.AsyncClient, httpx.AsyncClient], headers: dict[str, str]
) -> None:
    prefill, decode = nodes
    calls = [
        (prefill, "/internal/prefill", _prefill_body("no-token")),
        (prefill, "/internal/release", {"request_id": "no-token"}),
        (decode, "/internal/abort", {"request_id": "no-token"}),
    ]
    for client, path, body in calls:
        resp = await client.post(path, json=body, headers=headers)
        assert resp.status_code == 401, path
        error = NodeErrorResponse.model_validate_json(resp.content).error
        assert error.code == "unauthorized" and TOKEN not in resp.text
    idle = await wait_idle(prefill, headers=WITH_TOKEN)
    assert idle.counters.get("requests_total", 0) == 0  # nothing ran
    assert (await prefill.get("/ready")).status_code == 200  # probes stay open


@pytest.mark.parametrize("headers", [{}, {CLUSTER_TOKEN_HEADER: "wrong-token-0123456789"}])
async def test_stats_need_the_token_and_the_probes_stay_open(
    nodes: tuple[httpx.AsyncClient, httpx.AsyncClient], headers: dict[str, str]
) -> None:
    prefill, _ = nodes
    resp = await prefill.get("/stats", headers=headers)
    assert resp.status_code == 401, resp.text
    error = NodeErrorResponse.model_validate_json(resp.content).error
    assert error.code == "unauthorized" and "peer_info" not in resp.text
    for probe in ("/health", "/ready", "/metrics"):
        assert (await prefill.get(probe, headers=headers)).status_code == 200, probe
    allowed = await prefill.get("/stats", headers=WITH_TOKEN)
    assert allowed.status_code == 200 and allowed.json()["info"]["peer_info"]


async def test_a_reader_with_another_token_is_refused_and_recomputes(
    nodes: tuple[httpx.AsyncClient, httpx.AsyncClient], model_dir: Path
) -> None:
    prefill, decode = nodes
    resp = await prefill.post("/internal/prefill", json=_prefill_body("r1"), headers=WITH_TOKEN)
    assert resp.status_code == 200, resp.text
    answer = PrefillResponse.model_validate_json(resp.content)
    req = DecodeRequest(
        request_id="r1",
        prompt_token_ids=PROMPT,
        output_token_ids=[answer.first_token_id],
        sampling=SPEC,
        kv=answer.kv,
    )
    decode.headers[CLUSTER_TOKEN_HEADER] = OTHER
    try:
        events = await generate(decode, req)
    finally:
        del decode.headers[CLUSTER_TOKEN_HEADER]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    assert [answer.first_token_id, *tokens_of(events)] == offline_tokens(model_dir, PROMPT, params)
    samples = await scrape(decode)
    assert metric(samples, "splitserve_kv_transfer_failures_total", kind="refused") == 1
    assert events[-1].num_cached_tokens == 0  # recomputed here, no KV came over
    await prefill.post("/internal/release", json={"request_id": "r1"}, headers=WITH_TOKEN)
    assert (await wait_idle(prefill, headers=WITH_TOKEN)).load.leases_held == 0
