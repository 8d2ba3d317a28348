"""Each rank of a multi-rank node serves its own KV shard from its own process
(node.kv_shards.serve_rank_shards; over TCP its own listener, over NIXL its own agent): a
reader of another split gets one copy of the prompt's KV from rank 0 and rank 1, and once
rank 1's process is killed the next READ fails naming it, well within its deadline. A tiny
random Llama, TP = 2."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import LLMEngine
from kv_transfer import KVTransferAgent, PeerUnavailable, TransferConfig, nixl_available
from kv_transfer.head_plan import HeadSpan
from node.kv_shards import kv_shards, layout_text, model_layout, serve_rank_shards
from tests.engine.tiny_llama import save_tiny_llama
from tests.node.test_stage_engines import BASE, PARAMS, PROMPT, one_copy_bytes


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama-3-layers")
    save_tiny_llama(path, num_hidden_layers=3)
    return path


TRANSPORTS = [
    "tcp",
    pytest.param("nixl", marks=pytest.mark.skipif(not nixl_available(), reason="needs NIXL")),
]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_each_rank_serves_its_shard_from_its_own_process(
    tiny_dir: Path, transport: str
) -> None:
    def config(name: str) -> TransferConfig:
        return TransferConfig(name, transport=transport, poll_interval_s=0.01)

    prefill = LLMEngine(
        EngineConfig(model_dir=tiny_dir, role="prefill", tensor_parallel_size=2, **BASE)
    )
    owner = reader = None
    try:
        prefill.add_request("r", PROMPT, PARAMS)
        prefill.step()
        remote = prefill.pinned_blocks("r")
        layout = model_layout(prefill)
        owner = KVTransferAgent(
            prefill.runner.kv_cache,
            fingerprint=layout.fingerprint(),
            layout=layout_text(prefill),
            config=config("prefill"),
            shards=kv_shards(prefill),
        )
        serve_rank_shards(prefill, owner)
        own = [bool(s.tcp_port or s.nixl_metadata) for s in owner.info.shards]
        assert own == [False, True]  # rank 1's own listener or NIXL agent
        kv = torch.zeros(BASE["num_kv_blocks"], 3, 2, BASE["block_size"], 2, 16)
        reader = KVTransferAgent(
            kv, fingerprint=layout.fingerprint(), layout=layout.describe(), config=config("d")
        )
        local = list(range(len(remote)))
        result = await reader.read_blocks(owner.info, remote, local, request_id="r")
        assert result.nbytes == one_copy_bytes(len(remote))
        shards = kv_shards(prefill)
        assert shards is not None
        assert torch.equal(kv[local], shards.gather(remote, HeadSpan(0, 2)))
        assert kv[local].abs().sum() > 0
        assert prefill.ranks is not None
        rank1 = prefill.ranks.processes[0]
        rank1.kill()
        rank1.join(30.0)
        start = time.monotonic()
        with pytest.raises(PeerUnavailable, match="sending rank 1"):
            await reader.read_blocks(owner.info, remote, local, request_id="r2", deadline_s=30.0)
        assert time.monotonic() - start < 10.0
    finally:
        for agent in (owner, reader):
            if agent is not None:
                agent.close()
        prefill.close()
