"""`splitserve up --load-format random`: a prefill and a decode node serve seeded random
weights of a model's shapes from a directory that holds its config.json and tokenizer only (a
published model's shapes without its weights), the KV moving between them as for any model."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cluster_harness import running_cluster

pytestmark = pytest.mark.e2e
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def shapes_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("shapes-only")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (default_model_dir / name).is_file():
            shutil.copy(default_model_dir / name, path / name)
    assert not list(path.glob("*.safetensors")) and not list(path.glob("*.gguf"))
    return path


def test_nodes_serve_random_weights_of_the_model_shapes(shapes_dir: Path, tmp_path: Path) -> None:
    args = ["--prefill", "1", "--decode", "1", "--load-format", "random", "--transfer", "tcp"]
    with running_cluster(shapes_dir, tmp_path / "run", *args, "--num-kv-blocks", "64") as up:
        client = up.openai_client()
        prompt = "The history of Paris spans more than two thousand years, from a settlement " * 4
        got = client.completions.create(
            model=client.models.list().data[0].id, prompt=prompt, max_tokens=MAX_TOKENS,
            temperature=0, extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert got.usage is not None and got.usage.completion_tokens == MAX_TOKENS
        infos = [up.stats(name).info for name in up.layout["nodes"]]
        assert {i.architecture for i in infos} == {"LlamaForCausalLM"}
        assert len({i.weight_bytes for i in infos}) == 1 and infos[0].weight_bytes > 100 << 20
        decode = up.stats("decode-0")
        assert decode.counters.get("transfer_ok", 0) == 1  # the prompt's KV was moved (60 tokens)
