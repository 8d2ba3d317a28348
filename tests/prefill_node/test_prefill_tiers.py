"""A prefill node with a disk KV tier: /metrics shows the tiers from the start, one long
prompt's blocks are written to disk while the node stands idle after it, and a restarted
node finds at least 90% of them there."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from node_harness import BLOCK_SIZE, metric, node_settings, prefill, scrape, serving

from models.sampling_params import SamplingParams
from node.settings import NodeSettings
from prefill_node.app import create_app

pytestmark = pytest.mark.asyncio

SPEC = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
PROMPT = [(7 * j) % 120 + 3 for j in range(200)]  # 50 blocks of 4
BLOCK_BYTES = 2 * 2 * BLOCK_SIZE * 2 * 16 * 4  # layers x K/V x tokens x kv heads x dim x fp32


def _settings(model_dir: Path, redis_url: str, kv_dir: Path) -> NodeSettings:
    tiers: dict[str, Any] = {
        "kv_offload_cpu_gb": 0.01, "kv_offload_disk_path": kv_dir, "kv_offload_disk_gb": 0.01,
    }  # fmt: skip
    return node_settings(model_dir, redis_url, "prefill", num_kv_blocks=64, **tiers)


async def _disk(client: httpx.AsyncClient, name: str, **labels: str) -> float:
    return metric(await scrape(client), f"splitserve_kv_tier_{name}", tier="disk", **labels)


async def test_a_restarted_node_finds_a_long_prompt_on_disk(
    model_dir: Path, redis_url: str, tmp_path: Path
) -> None:
    blocks = len(PROMPT) // BLOCK_SIZE
    settings = _settings(model_dir, redis_url, tmp_path)
    async with serving(create_app(settings), settings) as client:
        assert await _disk(client, "capacity_blocks") > blocks  # before any request
        assert await _disk(client, "dropped_total") == 0
        await prefill(client, "long", PROMPT, SPEC)
        deadline = asyncio.get_running_loop().time() + 30
        while await _disk(client, "bytes_total", direction="in") < blocks * BLOCK_BYTES:
            assert asyncio.get_running_loop().time() < deadline, "not written while idle"
            await asyncio.sleep(0.05)
        assert len(list(tmp_path.glob("*.kvb"))) == blocks
    settings = _settings(model_dir, redis_url, tmp_path)  # the same directory, a new port
    async with serving(create_app(settings), settings) as client:
        assert await _disk(client, "used_blocks") == blocks  # re-indexed at start
        answer = await prefill(client, "again", PROMPT, SPEC)
        reusable = (len(PROMPT) - 1) // BLOCK_SIZE
        assert answer.num_cached_tokens >= 0.9 * reusable * BLOCK_SIZE
        assert await _disk(client, "hits_total") >= 0.9 * reusable
