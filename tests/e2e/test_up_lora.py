"""Multi-LoRA through `splitserve up` (1 prefill + 1 decode, and colocated), driven by the
openai client.

An adapter given at start and one loaded at run time answer like the offline engine with the
same adapter (prompts long enough to go through the prefill pool and the KV transfer, and a
short one prefilled on the decode node); both pools serve them; /v1/models lists them with
their parent; an unknown adapter is a 404 and a bad adapter file a 400 naming it, after which
the cluster keeps serving.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from cluster_harness import Cluster, running_cluster
from lora_adapters import make_adapter

from engine import LLM, LoRARequest
from models.sampling_params import SamplingParams

pytestmark = pytest.mark.e2e

LONG = [
    {
        "role": "user",
        "content": "Paris began as a small settlement on an island in the Seine and grew into "
        "the capital of France over two thousand years. Tell me about its history.",
    }
]
SHORT_PROMPT = "The capital of France is"  # below the router's local-prefill limit
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def adapters(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        name: make_adapter(default_model_dir, root / name, seed=i, rank=8, b_scale=0.25)
        for i, name in enumerate(("alpha", "beta"))
    }


@pytest.fixture(scope="module")
def offline(default_model_dir: Path, adapters: dict[str, Path]) -> dict[str | None, list[str]]:
    """The offline engine's greedy texts (chat, completion) per adapter (None: the base)."""
    llm = LLM(default_model_dir, enable_lora=True, max_loras=2, max_lora_rank=8, num_kv_blocks=256)
    chat = llm.tokenizer.apply_chat_template(LONG, True)
    short = llm.tokenizer.encode(SHORT_PROMPT, True)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    out: dict[str | None, list[str]] = {}
    for i, name in enumerate([None, *adapters]):
        lora = LoRARequest(name, i, adapters[name]) if name is not None else None
        out[name] = [o.text for o in llm.generate([chat, short], params, lora_request=lora)]
    return out


@pytest.fixture(scope="module")
def cluster(
    default_model_dir: Path, adapters: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    run_dir = tmp_path_factory.mktemp("up-lora")
    flags = ["--num-kv-blocks", "128", "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8"]
    flags += ["--lora-modules", f"alpha={adapters['alpha']}"]
    with running_cluster(default_model_dir, run_dir, *flags) as up:
        yield up


def _texts(client: openai.OpenAI, model: str) -> list[str]:
    chat = client.chat.completions.create(
        model=model, messages=LONG, max_tokens=MAX_TOKENS, temperature=0,  # type: ignore[arg-type]
    )  # fmt: skip
    done = client.completions.create(
        model=model, prompt=SHORT_PROMPT, max_tokens=MAX_TOKENS, temperature=0
    )
    return [chat.choices[0].message.content or "", done.choices[0].text]


def _served(cluster: Cluster, adapter: str) -> dict[str, float]:
    """Requests each node saw under the adapter."""
    return {
        name: cluster.stats(name).counters.get(f"lora_requests:{adapter}", 0)
        for name in cluster.layout["nodes"]
    }


def test_models_list_the_adapters_with_their_parent(cluster: Cluster) -> None:
    models = cluster.openai_client().models.list().data
    base = models[0].id
    assert [(m.id, getattr(m, "parent", None)) for m in models] == [(base, None), ("alpha", base)]


def test_start_adapter_equals_offline_on_both_pools(
    cluster: Cluster, offline: dict[str | None, list[str]]
) -> None:
    client = cluster.openai_client()
    assert _texts(client, "alpha") == offline["alpha"]
    assert offline["alpha"] != offline[None]
    base = client.models.list().data[0].id
    assert _texts(client, base) == offline[None]
    assert all(n >= 1 for n in _served(cluster, "alpha").values())


def test_runtime_load_serves_on_both_pools(
    cluster: Cluster, adapters: dict[str, Path], offline: dict[str | None, list[str]]
) -> None:
    body = {"lora_name": "beta", "lora_path": str(adapters["beta"])}
    resp = httpx.post(cluster.base_url + "/v1/load_lora_adapter", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    assert all(cluster.stats(n).counters.get("lora_loads", 0) >= 2 for n in cluster.layout["nodes"])
    client = cluster.openai_client()
    assert "beta" in [m.id for m in client.models.list().data]
    assert _texts(client, "beta") == offline["beta"]
    assert all(n >= 1 for n in _served(cluster, "beta").values())


def test_unknown_adapter_is_a_404(cluster: Cluster) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        _texts(cluster.openai_client(), "gamma")
    assert info.value.code == "model_not_found"


def test_bad_adapter_file_is_a_400_naming_it_and_the_cluster_keeps_serving(
    cluster: Cluster, tmp_path: Path, offline: dict[str | None, list[str]]
) -> None:
    (tmp_path / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 8}')
    (tmp_path / "adapter_model.safetensors").write_bytes(b"garbage")
    body = {"lora_name": "broken", "lora_path": str(tmp_path)}
    resp = httpx.post(cluster.base_url + "/v1/load_lora_adapter", json=body, timeout=120)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert "adapter_model.safetensors" in error["message"] and error["param"] == "lora_path"
    client = cluster.openai_client()
    assert "broken" not in [m.id for m in client.models.list().data]
    assert _texts(client, "alpha") == offline["alpha"]
    names = list(cluster.layout["nodes"])
    assert all(s.load.free_blocks == s.load.total_blocks for s in cluster.wait_idle(names).values())


def test_a_colocated_node_answers_as_both_pools(
    default_model_dir: Path,
    adapters: dict[str, Path],
    offline: dict[str | None, list[str]],
    tmp_path: Path,
) -> None:
    """The same adapter on one colocated node: the answers the 1 x 1 cluster gave (offline's)."""
    flags = ["--colocated", "--num-kv-blocks", "128", "--enable-lora", "--max-lora-rank", "8"]
    flags += ["--lora-modules", f"alpha={adapters['alpha']}"]
    with running_cluster(default_model_dir, tmp_path, *flags) as up:
        assert _texts(up.openai_client(), "alpha") == offline["alpha"]
        assert all(n >= 1 for n in _served(up, "alpha").values())
