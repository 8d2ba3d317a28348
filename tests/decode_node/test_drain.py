"""Drain (what SIGTERM starts): /ready turns 503 and the node leaves the registry at once,
new work is refused with 503 "draining", while releases, aborts and running streams go on."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import redis.asyncio as aioredis
from node_harness import generate, node_settings, serving, tokens_of, wait_idle

from cluster.protocol import DecodeRequest, NodeErrorResponse
from cluster.registry import node_key
from decode_node.app import create_app as decode_app
from models.sampling_params import SamplingParams
from node.server import begin_drain
from prefill_node.app import create_app as prefill_app

PROMPT = [5, 9, 17, 33, 4, 8, 12, 40, 41]
SPEC = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)


async def _registered(redis_url: str, node_id: str) -> bool:
    client = aioredis.Redis.from_url(redis_url)
    try:
        return bool(await client.exists(node_key(node_id)))
    finally:
        await client.aclose()


async def test_a_draining_node_leaves_and_refuses_new_work_only(
    model_dir: Path, redis_url: str
) -> None:
    p_set = node_settings(model_dir, redis_url, "prefill")
    d_set = node_settings(model_dir, redis_url, "decode")
    p_app, d_app = prefill_app(p_set), decode_app(d_set)
    async with serving(p_app, p_set) as prefill, serving(d_app, d_set) as decode:
        for client in (prefill, decode):
            while (await client.get("/ready")).status_code != 200:
                await asyncio.sleep(0.05)
        running = asyncio.create_task(
            generate(
                decode, DecodeRequest(request_id="run", prompt_token_ids=PROMPT, sampling=SPEC)
            )
        )
        while (await wait_idle(decode, 0)).load.running == 0:
            await asyncio.sleep(0.01)
        for app in (p_app, d_app):
            begin_drain(app)
        for client, node_id in ((prefill, p_set.node_id), (decode, d_set.node_id)):
            ready = await client.get("/ready")
            assert ready.status_code == 503 and ready.json()["status"] == "draining"
            assert ready.json()["serving"] is False  # routers drop it even without its key
            for _ in range(100):  # deregistered within the heartbeat loop's next turn
                if not await _registered(redis_url, str(node_id)):
                    break
                await asyncio.sleep(0.05)
            assert not await _registered(redis_url, str(node_id))
        body = {
            "request_id": "new",
            "prompt_token_ids": PROMPT,
            "sampling": dataclasses.asdict(SPEC),
        }
        for client, path in ((prefill, "/internal/prefill"), (decode, "/internal/generate")):
            resp = await client.post(path, json=body)
            assert resp.status_code == 503, path
            assert NodeErrorResponse.model_validate_json(resp.content).error.code == "draining"
        assert (
            await prefill.post("/internal/release", json={"request_id": "x"})
        ).status_code == 200
        events = await asyncio.wait_for(running, 60)  # the running stream finishes
        assert len(tokens_of(events)) == SPEC.max_tokens and events[-1].error is None
