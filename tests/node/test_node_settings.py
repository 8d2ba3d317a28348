"""A node's settings: its own, the engine's and the transfer agent's, each checked by its
component before any model loads."""

from __future__ import annotations

import pytest

from config_kit import SettingsError, build, load
from node.settings import NodeSettings


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"role": "router"}, "role (--role, env SPLITSERVE_ROLE)"),
        ({"transfer": "carrier-pigeon"}, "transfer (--transfer, env SPLITSERVE_TRANSFER)"),
        ({"block_size": 0}, "block_size (--block-size, env SPLITSERVE_BLOCK_SIZE)"),
        ({"ttl_s": 1.0, "heartbeat_s": 2.0}, "ttl_s (1.0) must be greater than heartbeat_s"),
        ({"num_kv_blocks": 10, "kv_cache_memory_gb": 1.0}, "num_kv_blocks or kv_cache_memory_gb"),
        ({"node_id": "has space"}, "node_id (--node-id, env SPLITSERVE_NODE_ID)"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size (--tensor-parallel-size, env"),
        ({"pipeline_parallel_size": 0}, "pipeline_parallel_size"),
        ({"cluster_token": "short"}, "cluster_token must be at least 16 characters"),
        ({"max_loras": 4, "max_cpu_loras": 2}, "max_cpu_loras must be an integer >= max_loras"),
    ],
)
def test_bad_values_are_named(values: dict[str, object], named: str) -> None:
    with pytest.raises(SettingsError) as exc:
        build(NodeSettings, **values)
    assert named in str(exc.value)


@pytest.mark.parametrize("role", ["prefill", "decode", "colocated"])
def test_every_role_takes_a_tensor_and_a_pipeline_parallel_size(role: str) -> None:
    settings = load(NodeSettings, role=role, tensor_parallel_size=2, pipeline_parallel_size=2)
    assert (settings.engine.tensor_parallel_size, settings.engine.pipeline_parallel_size) == (2, 2)


def test_a_bad_variable_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPLITSERVE_MAX_NUM_SEQS", "many")
    with pytest.raises(SettingsError, match="SPLITSERVE_MAX_NUM_SEQS"):
        load(NodeSettings)


def test_node_identity_and_url() -> None:
    node = build(NodeSettings, role="prefill", port=8123, advertise_host="10.1.2.3")
    assert node.url() == "http://10.1.2.3:8123"
    assert node.resolved_node_id().startswith("prefill-")
    assert NodeSettings(node_id="p-1").resolved_node_id() == "p-1"
