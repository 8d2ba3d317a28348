"""KV exported by a prefill engine of one split (tensor- and pipeline-parallel sizes) and
imported by a decode engine of another, through the transfer agents the nodes build
(node.kv_shards, TCP): the decode engine's greedy tokens equal a colocated engine of one
rank's, and the bytes moved are one copy of the prompt's KV. A tiny random Llama of 3 layers
(stages of 1 and 2 layers) and 2 KV heads.

One multi-rank engine runs in a process at a time (torch.distributed's default group): the
prefill engine's KV, read from rank 0's process as the node's agent sees it, is kept, the
engine closed, and an owner agent serves the kept per-rank tensors with the same parts."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.engine import LLMEngine
from kv_transfer import KVTransferAgent, LeaseTable, TransferConfig
from kv_transfer.shards import KVShards
from kv_transfer.tcp_heads import local_shards
from models.sampling_params import SamplingParams
from node.kv_shards import kv_shards, layout_text, model_layout
from tests.engine.tiny_llama import save_tiny_llama
from tests.kv_transfer.test_tcp_heads import wait_released

PROMPT = [1, 5, 9, 33, 7, 100, 3, 17, 64, 12, 80, 41, 6, 22, 90, 3, 15, 8, 19, 40, 11, 2]
PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
BASE = {"block_size": 4, "num_kv_blocks": 32}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama-3-layers")
    save_tiny_llama(path, num_hidden_layers=3)
    return path


@pytest.fixture(scope="module")
def want(tiny_dir: Path) -> list[int]:
    engine = LLMEngine(EngineConfig(model_dir=tiny_dir, **BASE))
    try:
        return run(engine, "r")
    finally:
        engine.close()


def run(engine: LLMEngine, rid: str, tokens: list[int] | None = None) -> list[int]:
    got = list(tokens or [])
    if tokens is None:
        engine.add_request(rid, PROMPT, PARAMS)
    while engine.has_unfinished():
        for out in engine.step():
            got += out.new_token_ids
    return got


def shards_of(engine: LLMEngine) -> KVShards:
    """The engine's KV as its node's agent sees it, kept after the engine closes."""
    live = kv_shards(engine) or local_shards(engine.runner.kv_cache, None)
    return KVShards([t.clone() for t in live.tensors], live.spans, live.num_kv_heads, live.layers)


def agent(
    name: str, shards: KVShards, layout: str, leases: LeaseTable | None = None
) -> KVTransferAgent:
    return KVTransferAgent(
        shards.tensors[0],
        fingerprint=layout,
        layout=layout,
        config=TransferConfig(name, transport="tcp", poll_interval_s=0.01),
        leases=leases,
        shards=shards if shards.size > 1 else None,
    )


def one_copy_bytes(num_blocks: int) -> int:
    layers, kv_heads, head_dim = 3, 2, 16  # tiny Llama: hidden 64 over 4 heads
    return num_blocks * layers * 2 * BASE["block_size"] * kv_heads * head_dim * 4


@pytest.mark.parametrize(
    ("src", "dst"),
    [((1, 2), (1, 1)), ((1, 1), (1, 2)), ((2, 1), (1, 2))],
    ids=["pp2-to-pp1", "pp1-to-pp2", "tp2-to-pp2"],
)
async def test_decode_of_another_split_answers_like_one_rank(
    tiny_dir: Path, want: list[int], src: tuple[int, int], dst: tuple[int, int]
) -> None:
    sizes = {"tensor_parallel_size": src[0], "pipeline_parallel_size": src[1]}
    prefill = LLMEngine(EngineConfig(model_dir=tiny_dir, role="prefill", **BASE, **sizes))
    try:
        prefill.add_request("r", PROMPT, PARAMS)
        first = prefill.step()[0].new_token_ids
        remote_ids = prefill.pinned_blocks("r")
        owned = shards_of(prefill)
        fingerprint = model_layout(prefill).fingerprint()
        assert layout_text(prefill).endswith(f"tp={src[0]} pp={src[1]}")
    finally:
        prefill.close()
    sizes = {"tensor_parallel_size": dst[0], "pipeline_parallel_size": dst[1]}
    decode = LLMEngine(EngineConfig(model_dir=tiny_dir, role="decode", **BASE, **sizes))
    freed: list[str] = []
    leases = LeaseTable(on_free=lambda rid, _ids: freed.append(rid))
    owner = agent("prefill", owned, fingerprint, leases)
    reader = KVTransferAgent(
        decode.runner.kv_cache,
        fingerprint=model_layout(decode).fingerprint(),
        layout=layout_text(decode),
        config=TransferConfig("decode", transport="tcp", poll_interval_s=0.01),
        shards=kv_shards(decode),
    )
    try:
        assert model_layout(decode).fingerprint() == fingerprint  # any split matches
        plan = decode.import_request("r", PROMPT, list(first), PARAMS)
        assert plan is not None and plan.num_cached_blocks == 0
        leases.grant("r", remote_ids, 30.0)
        local_ids = list(plan.fill_block_ids)
        result = await reader.read_blocks(
            owner.info, remote_ids[: len(local_ids)], local_ids, request_id="r"
        )
        assert result.nbytes == one_copy_bytes(len(local_ids))  # each layer and head once
        decode.commit_import("r")
        assert run(decode, "r", list(first)) == want
        await wait_released(owner, freed)
        assert decode.stats().free_blocks == decode.stats().total_blocks
    finally:
        owner.close()
        reader.close()
        decode.close()
