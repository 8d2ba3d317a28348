"""POST /v1/embeddings against `splitserve up` (1 prefill + 1 decode node, the default model):
with the official openai client, the vector of a text equals the one pooled from
transformers' hidden states of the same model (last token and mean, normalized); texts and
token ids, float and base64, usage in OpenAI's shape; bad input gets OpenAI's error naming the
field; the prefill node holds no block and no lease afterwards."""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from cluster_harness import Cluster, running_cluster
from transformers import AutoModelForCausalLM, AutoTokenizer

pytestmark = pytest.mark.e2e
MODEL = "smollm2"
TEXTS = ["The capital of France is Paris.", "Embeddings map text to vectors."]


@pytest.fixture(scope="module")
def cluster(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    run_dir = tmp_path_factory.mktemp("up-embeddings")
    with running_cluster(default_model_dir, run_dir, "--num-kv-blocks", "64") as up:
        yield up


@pytest.fixture(scope="module")
def hf_vectors(default_model_dir: Path) -> dict[str, torch.Tensor]:
    """transformers' final hidden states of each text, pooled and normalized."""
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    model = AutoModelForCausalLM.from_pretrained(default_model_dir, torch_dtype=torch.float32)
    out: dict[str, torch.Tensor] = {}
    for text in TEXTS:
        ids = tokenizer(text, return_tensors="pt").input_ids
        with torch.no_grad():
            h = model(ids, output_hidden_states=True).hidden_states[-1][0]  # [tokens, hidden]
        for pooling, v in (("last", h[-1]), ("mean", h.mean(0))):
            out[f"{pooling}:{text}"] = torch.nn.functional.normalize(v.float(), dim=0)
    return out


def _cosine(a: list[float], b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(torch.tensor(a), b, dim=0))


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_vectors_equal_transformers_hidden_states(
    cluster: Cluster, hf_vectors: dict[str, torch.Tensor], pooling: str
) -> None:
    client = cluster.openai_client()
    got = client.embeddings.create(model=MODEL, input=TEXTS, extra_body={"pooling_type": pooling})
    assert [d.index for d in got.data] == [0, 1] and got.object == "list"
    for text, item in zip(TEXTS, got.data, strict=True):
        assert _cosine(item.embedding, hf_vectors[f"{pooling}:{text}"]) > 0.9999
    assert got.usage.prompt_tokens == got.usage.total_tokens > 0


def test_token_ids_and_base64_give_the_same_vector(cluster: Cluster) -> None:
    client = cluster.openai_client()
    text = client.embeddings.create(model=MODEL, input=TEXTS[0], encoding_format="float")
    ids = httpx.post(
        cluster.base_url + "/tokenize", json={"model": MODEL, "prompt": TEXTS[0]}, timeout=30
    ).json()["tokens"]
    raw = httpx.post(
        cluster.base_url + "/v1/embeddings",
        json={"model": MODEL, "input": [ids], "encoding_format": "base64"},
        timeout=60,
    ).json()
    packed = base64.b64decode(raw["data"][0]["embedding"])
    vector = struct.unpack(f"<{len(packed) // 4}f", packed)
    assert len(vector) == len(text.data[0].embedding) == 576
    assert _cosine(list(vector), torch.tensor(text.data[0].embedding)) > 0.99999
    assert raw["usage"] == {"prompt_tokens": len(ids), "total_tokens": len(ids)}
    same = client.embeddings.create(model=MODEL, input=TEXTS[0], dimensions=576)
    assert len(same.data[0].embedding) == 576


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": ""}, "input"),
        ({"input": [[1, 2], []]}, "input"),
        ({"input": [5, 10**6]}, "input"),
        ({"input": "hi", "dimensions": 10}, "dimensions"),
        ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "hi", "pooling_type": "cls"}, "pooling_type"),
        ({"input": "hi", "model": "nope"}, "model"),
        ({"input": "word " * 9000}, "input"),
    ],
)
def test_bad_input_names_the_field(cluster: Cluster, body: dict[str, object], param: str) -> None:
    resp = httpx.post(cluster.base_url + "/v1/embeddings", json={"model": MODEL} | body, timeout=60)
    assert 400 <= resp.status_code < 500, resp.text
    assert resp.json()["error"]["param"] == param


def test_no_block_or_lease_is_left(cluster: Cluster) -> None:
    client = cluster.openai_client()
    client.embeddings.create(model=MODEL, input=["a longer text " * 40] * 3)
    prefill = cluster.node_names("prefill")
    for stats in cluster.wait_idle(prefill).values():
        assert stats.load.free_blocks == stats.load.total_blocks
        assert stats.load.leases_held == 0
