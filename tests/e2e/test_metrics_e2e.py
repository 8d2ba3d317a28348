"""`splitserve up` with 1 prefill + 1 decode node: after N disaggregated requests, the
router's and both nodes' /metrics agree with each other, with N, and with the usage the
client was told."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cluster_harness import Cluster, running_cluster
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.e2e

PROMPT = (
    "The history of Paris spans more than two thousand years. It began as a small settlement "
    "on an island in the Seine and grew into the capital of France. Chapter {i}:"
)  # longer than the router's local-prefill limit: every request goes through the prefill pool
N = 3


@pytest.fixture(scope="module")
def cluster(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    run_dir = tmp_path_factory.mktemp("up-metrics")
    with running_cluster(default_model_dir, run_dir, "--num-kv-blocks", "128") as up:
        yield up


class Scrape:
    def __init__(self, url: str) -> None:
        text = httpx.get(url + "/metrics", timeout=10, trust_env=False).text
        self.samples = [s for f in text_string_to_metric_families(text) for s in f.samples]

    def __call__(self, name: str, **labels: str) -> float:
        want = set(labels.items())
        return sum(
            s.value for s in self.samples if s.name == name and want <= set(s.labels.items())
        )


def test_router_and_nodes_agree(cluster: Cluster) -> None:
    client = cluster.openai_client()
    model = client.models.list().data[0].id
    prompt_tokens = completion_tokens = 0
    for i in range(N):
        stream = client.completions.create(
            model=model,
            prompt=PROMPT.format(i=i),
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = [c.usage for c in stream if c.usage is not None][-1]
        prompt_tokens += usage.prompt_tokens
        completion_tokens += usage.completion_tokens
    (prefill_name,) = cluster.node_names("prefill")
    (decode_name,) = cluster.node_names("decode")
    cluster.wait_idle([prefill_name, decode_name])
    deadline = time.monotonic() + 10
    while (router := Scrape(cluster.base_url))("splitserve_router_e2e_seconds_count") < N:
        assert time.monotonic() < deadline, "the router did not record every request"
        time.sleep(0.1)
    prefill = Scrape(cluster.node_url(prefill_name))
    decode = Scrape(cluster.node_url(decode_name))

    answered = router("splitserve_router_requests_total", route="/v1/completions", status="200")
    assert answered == N
    assert router("splitserve_router_ttft_seconds_count") == N
    assert router("splitserve_router_local_prefill_total") == 0
    assert router("splitserve_router_prompt_tokens_total") == prompt_tokens
    assert prefill("splitserve_prompt_tokens_total", role="prefill") == prompt_tokens
    assert decode("splitserve_prompt_tokens_total", role="decode") == prompt_tokens
    assert router("splitserve_router_completion_tokens_total") == completion_tokens
    generated = prefill("splitserve_generation_tokens_total") + decode(
        "splitserve_generation_tokens_total"
    )
    assert generated == completion_tokens  # token 1 on the prefill node, the rest on decode
    assert prefill("splitserve_generation_tokens_total") == N
    assert prefill("splitserve_ttft_seconds_count") == N
    assert decode("splitserve_e2e_seconds_count") == N
    assert decode("splitserve_kv_transfer_seconds_count") == N
    assert decode("splitserve_kv_transfer_failures_total") == 0
    assert decode("splitserve_kv_transfer_bytes_total") > 0
