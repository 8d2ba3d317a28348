"""Nodes over a tiny random-weight Llama, served in this process by real uvicorn servers on
localhost, registered in an embedded Redis. Shared by tests/prefill_node and
tests/decode_node (the prefill tests put this folder on sys.path in their conftest)."""

from __future__ import annotations

import asyncio
import dataclasses
import io
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer, models
from transformers import LlamaConfig, LlamaForCausalLM

from cluster.listen import open_listener
from cluster.node_records import NodeStats
from cluster.protocol import DecodeRequest, PrefillResponse, TokenEvent
from config_kit import build
from engine.config import EngineConfig
from engine.engine import LLMEngine
from launcher.redis_server import EmbeddedRedis, free_port
from models.sampling_params import SamplingParams
from node.settings import NodeSettings

VOCAB = 128
TINY: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
BLOCK_SIZE = 4
NUM_BLOCKS = 32
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]  # (name, labels) -> value


def save_tiny_model(path: Path) -> Path:
    """A random Llama whose logits are far from uniform (so greedy has no near-ties), plus a
    word-level tokenizer.json (model-dir validation wants one; nodes never tokenize)."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    model.save_pretrained(path)
    vocab = {f"t{i}": i for i in range(VOCAB)}
    Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(str(path / "tokenizer.json"))
    return path


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model on disk, once per session (conftests import this fixture)."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """An embedded Redis per test module (conftests import this fixture)."""
    with EmbeddedRedis() as server:
        yield server.url


def node_settings(model_dir: Path, redis_url: str, role: str, **overrides: Any) -> NodeSettings:
    port = free_port()
    fields: dict[str, Any] = {
        "model": str(model_dir),
        "role": role,
        "port": port,
        "redis_url": redis_url,
        "node_id": f"{role}-{port}",
        "block_size": BLOCK_SIZE,
        "num_kv_blocks": NUM_BLOCKS,
        "torch_threads": 1,
        "transfer": "tcp",
        "heartbeat_s": 0.2,
        "ttl_s": 1.0,
    }
    return build(NodeSettings, **(fields | overrides))


@asynccontextmanager
async def serving(app: Any, settings: NodeSettings) -> AsyncIterator[httpx.AsyncClient]:
    """Run the node app (lifespan included) until the block ends; yields a client for it."""
    sock = open_listener(settings.host, settings.port)
    config = uvicorn.Config(
        app, lifespan="on", loop="asyncio", log_level="warning", timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("node exited at start")
            await asyncio.sleep(0.02)
        async with httpx.AsyncClient(base_url=settings.url(), trust_env=False) as client:
            yield client
    finally:
        server.should_exit = True
        try:
            await asyncio.wait_for(task, 30)
        except TimeoutError:
            stacks = io.StringIO()
            for other in asyncio.all_tasks():
                other.print_stack(file=stacks)
            raise RuntimeError(
                f"node {settings.node_id} did not stop in 30 s; tasks:\n{stacks.getvalue()}"
            ) from None
        finally:
            sock.close()


async def stats(client: httpx.AsyncClient, headers: dict[str, str] | None = None) -> NodeStats:
    """GET /stats; `headers` carry the cluster token of a node that has one."""
    resp = await client.get("/stats", headers=headers)
    resp.raise_for_status()
    return NodeStats.model_validate_json(resp.content)


async def wait_idle(
    client: httpx.AsyncClient, timeout_s: float = 10.0, headers: dict[str, str] | None = None
) -> NodeStats:
    """Stats once every block is free and no lease is held (or the last stats at timeout)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        now = await stats(client, headers)
        load = now.load
        idle = load.free_blocks == load.total_blocks and load.leases_held == 0
        if (idle and load.running == 0) or asyncio.get_running_loop().time() > deadline:
            return now
        await asyncio.sleep(0.05)


async def prefill(
    client: httpx.AsyncClient, rid: str, prompt: list[int], params: SamplingParams
) -> PrefillResponse:
    """POST /internal/prefill, then /internal/release (no decode node reads the blocks)."""
    body = {"request_id": rid, "prompt_token_ids": prompt, "sampling": dataclasses.asdict(params)}
    resp = await client.post("/internal/prefill", json=body)
    assert resp.status_code == 200, resp.text
    await client.post("/internal/release", json={"request_id": rid})
    return PrefillResponse.model_validate_json(resp.content)


async def generate(client: httpx.AsyncClient, req: DecodeRequest) -> list[TokenEvent]:
    """POST /internal/generate and read the whole NDJSON stream."""
    events = []
    body = req.model_dump_json()
    headers = {"content-type": "application/json"}
    async with client.stream("POST", "/internal/generate", content=body, headers=headers) as r:
        if r.status_code != 200:
            await r.aread()
            r.raise_for_status()
        async for line in r.aiter_lines():
            if line.strip():
                events.append(TokenEvent.model_validate_json(line))
    return events


def tokens_of(events: Sequence[TokenEvent]) -> list[int]:
    return [t for e in events for t in e.token_ids]


def offline_tokens(model_dir: Path, prompt: list[int], params: SamplingParams) -> list[int]:
    """The same model run by one engine in this process: the expected greedy output."""
    engine = LLMEngine(
        EngineConfig(model_dir=model_dir, block_size=BLOCK_SIZE, num_kv_blocks=NUM_BLOCKS)
    )
    engine.add_request("offline", prompt, params)
    tokens: list[int] = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens.extend(out.new_token_ids)
    return tokens


def metric_samples(text: str) -> Samples:
    """Every sample of a /metrics text, by (sample name, labels)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def scrape(client: httpx.AsyncClient) -> Samples:
    resp = await client.get("/metrics")
    resp.raise_for_status()
    return metric_samples(resp.text)


def metric(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels` (0 when none)."""
    wanted = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and wanted <= lab)
