"""Router and node settings: environment, overrides, and errors that name the field."""

from __future__ import annotations

import pytest

from cluster.settings import NodeSettings, RouterSettings, SettingsError, load


def test_environment_is_read_and_overrides_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPLITSERVE_PORT", "9001")
    monkeypatch.setenv("SPLITSERVE_POLICY", "round_robin")
    settings = load(RouterSettings, port=9002, api_key=None)
    assert settings.port == 9002 and settings.policy == "round_robin"
    assert settings.api_key is None


def test_settings_are_frozen() -> None:
    settings = RouterSettings()
    with pytest.raises(ValueError):
        settings.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("cls", "kwargs", "named"),
    [
        (RouterSettings, {"port": 70000}, "port (env SPLITSERVE_PORT)"),
        (RouterSettings, {"policy": "random"}, "policy"),
        (RouterSettings, {"local_prefill_max_tokens": -1}, "local_prefill_max_tokens"),
        (RouterSettings, {"reasoning_parser": "gpt_oss"}, "reasoning_parser"),
        (RouterSettings, {"reasoning_parser": "granite"}, "reasoning_parser"),
        (NodeSettings, {"role": "router"}, "role"),
        (NodeSettings, {"transfer": "carrier-pigeon"}, "transfer"),
        (NodeSettings, {"block_size": 0}, "block_size"),
        (NodeSettings, {"ttl_s": 1.0, "heartbeat_s": 2.0}, "ttl_s"),
        (NodeSettings, {"num_kv_blocks": 10, "kv_cache_memory_gb": 1.0}, "num_kv_blocks"),
        (NodeSettings, {"node_id": "has space"}, "node_id"),
        (NodeSettings, {"tensor_parallel_size": 0}, "tensor_parallel_size"),
        (NodeSettings, {"pipeline_parallel_size": 0}, "pipeline_parallel_size"),
    ],
)
def test_invalid_values_raise_settings_error_naming_the_field(
    cls: type[RouterSettings] | type[NodeSettings], kwargs: dict[str, object], named: str
) -> None:
    with pytest.raises(SettingsError) as exc:
        load(cls, **kwargs)
    assert named in str(exc.value)


@pytest.mark.parametrize("role", ["prefill", "decode", "colocated"])
def test_every_role_takes_a_tensor_and_a_pipeline_parallel_size(role: str) -> None:
    settings = load(NodeSettings, role=role, tensor_parallel_size=2, pipeline_parallel_size=2)
    assert (settings.tensor_parallel_size, settings.pipeline_parallel_size) == (2, 2)


def test_bad_environment_value_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPLITSERVE_MAX_NUM_SEQS", "many")
    with pytest.raises(SettingsError, match="max_num_seqs"):
        load(NodeSettings)


def test_gpt_oss_reasoning_is_refused_saying_why() -> None:
    with pytest.raises(SettingsError, match="harmony"):
        load(RouterSettings, reasoning_parser="gpt_oss")


def test_served_model_name_defaults_to_the_model_name() -> None:
    assert RouterSettings(model="smollm2").model_name() == "smollm2"
    assert RouterSettings(model="models/my-llama").model_name() == "my-llama"
    assert RouterSettings(model="x", served_model_name="public").model_name() == "public"


def test_node_identity_and_url() -> None:
    node = NodeSettings(role="prefill", port=8123, advertise_host="10.1.2.3")
    assert node.url() == "http://10.1.2.3:8123"
    assert node.resolved_node_id().startswith("prefill-")
    assert NodeSettings(node_id="p-1").resolved_node_id() == "p-1"
