"""The decode node with a hybrid model (Qwen3-Next, tiny random weights): the prefill
node's handle carries the linear-attention state record after the prompt's blocks, the
decode node reads it with them and continues with the offline engine's tokens; a handle
whose record blocks hold no record (here: prompt blocks in their place) is refused and
the prompt recomputed, with the same tokens, nothing left held."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from node_harness import (
    VOCAB,
    generate,
    node_settings,
    offline_tokens,
    serving,
    tokens_of,
    wait_idle,
)
from node_harness import stats as node_stats
from tokenizers import Tokenizer, models

from cluster.protocol import DecodeRequest, PrefillResponse
from decode_node.app import create_app as decode_app
from models.sampling_params import SamplingParams
from prefill_node.app import create_app as prefill_app
from tests.engine.model.tiny_families import save_family

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROMPT = [5, 9, 17, 33, 4, 8, 12, 40, 41]  # 9 tokens: 3 blocks of 4
PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen3_next")
    save_family("qwen3_next", path, vocab_size=VOCAB)
    vocab = {f"t{i}": i for i in range(VOCAB)}
    Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(str(path / "tokenizer.json"))
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def nodes(
    hybrid_dir: Path, redis_url: str
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    specs = [
        node_settings(hybrid_dir, redis_url, "prefill"),
        node_settings(hybrid_dir, redis_url, "decode"),
    ]
    async with (
        serving(prefill_app(specs[0]), specs[0]) as prefill,
        serving(decode_app(specs[1]), specs[1]) as decode,
    ):
        yield prefill, decode


async def _prefill(node: httpx.AsyncClient, rid: str) -> PrefillResponse:
    body = {"request_id": rid, "prompt_token_ids": PROMPT, "sampling": dataclasses.asdict(PARAMS)}
    resp = await node.post("/internal/prefill", json=body)
    assert resp.status_code == 200, resp.text
    return PrefillResponse.model_validate_json(resp.content)


def _decode_req(rid: str, answer: PrefillResponse) -> DecodeRequest:
    return DecodeRequest(
        request_id=rid, prompt_token_ids=PROMPT, output_token_ids=[answer.first_token_id],
        sampling=PARAMS, kv=answer.kv,
    )  # fmt: skip


@pytest.mark.parametrize("record", ["shipped", "missing"])
async def test_the_state_record_is_decoded_from_or_refused_and_recomputed(
    nodes: tuple[httpx.AsyncClient, httpx.AsyncClient], hybrid_dir: Path, record: str
) -> None:
    prefill, decode = nodes
    expected = offline_tokens(hybrid_dir, PROMPT, PARAMS)
    before = (await node_stats(decode)).counters
    answer = await _prefill(prefill, record)
    assert answer.kv is not None and len(answer.kv.block_ids) > 3  # the prompt's + the record's
    req = _decode_req(record, answer)
    if record == "missing":  # the record's blocks replaced by the prompt's: no record there
        blocks = answer.kv.block_ids
        fake = blocks[:3] + (blocks[:3] * 4)[: len(blocks) - 3]
        req = req.model_copy(update={"kv": answer.kv.model_copy(update={"block_ids": fake})})
    events = await generate(decode, req)
    assert [answer.first_token_id, *tokens_of(events)] == expected
    idle = await wait_idle(decode)
    assert idle.load.free_blocks == idle.load.total_blocks
    failed = int(record == "missing")
    for name in ("transfer_failures_total", "recomputes_total"):
        assert idle.counters.get(name, 0) == before.get(name, 0) + failed, name
    await prefill.post("/internal/release", json={"request_id": record})
    idle = await wait_idle(prefill)
    assert idle.load.free_blocks == idle.load.total_blocks
