from __future__ import annotations

import dataclasses
import json

import pytest

from kv_transfer import PeerInfo, TransferConfig, TransportKind
from kv_transfer.head_plan import RankShard


def nixl_info() -> PeerInfo:
    return PeerInfo(
        node_name="prefill-0",
        incarnation="abc123",
        transport=TransportKind.NIXL,
        fingerprint="fp1",
        layout="model=m dtype=float32",
        num_blocks=100,
        block_bytes=737280,
        mem_type="DRAM",
        device_id=0,
        base_address=0x7F0000000000,
        nixl_metadata=bytes(range(256)) * 3,  # binary, not UTF-8
    )


def test_round_trips_through_json_and_bytes() -> None:
    info = nixl_info()
    assert PeerInfo.from_json(info.to_json()) == info
    assert PeerInfo.from_bytes(info.to_bytes()) == info
    tcp = dataclasses.replace(
        info, transport=TransportKind.TCP, nixl_metadata=None, tcp_host="10.0.0.5", tcp_port=7001
    )
    assert PeerInfo.from_json(tcp.to_json()) == tcp
    assert tcp.agent_name == "prefill-0.abc123"


def test_rank_agents_round_trip_and_old_shards_stay_as_they_were() -> None:
    """A rank's own NIXL agent travels per shard (base64); a shard without one publishes
    the fields it did before rank agents; a shard field this reader does not know (a
    newer sender's) is left out rather than refusing the whole PeerInfo."""
    shard = RankShard(0, 1, 0x1000, 64, 0, 0, 2)
    own = dataclasses.replace(shard, start=1, nixl_metadata=bytes(range(256)), agent_base_address=7)
    info = dataclasses.replace(nixl_info(), num_kv_heads=2, shards=(shard, own))
    again = PeerInfo.from_json(info.to_json())
    assert again == info and again.shards[1].nixl_metadata == bytes(range(256))
    assert again.rank_agent(0) == (info.agent_name, info.nixl_metadata)
    assert again.rank_agent(1) == (f"{info.agent_name}.rank1", bytes(range(256)))
    assert [s.base_address for s in again.agent_shards(2, 2)] == [0x1000, 7]
    published = json.loads(info.to_json())["shards"]
    assert "nixl_metadata" not in published[0] and "agent_base_address" not in published[0]
    published[0]["from_a_newer_sender"] = 1
    text = json.dumps({**json.loads(info.to_json()), "shards": published})
    assert PeerInfo.from_json(text) == info


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("not json", "not valid JSON"),
        ('{"v": 99}', "v=1"),
        ('{"v": 1, "node_name": "x"}', "fields are wrong"),
    ],
)
def test_bad_text_is_a_value_error(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        PeerInfo.from_json(text)


def test_each_transport_needs_its_address() -> None:
    with pytest.raises(ValueError, match="nixl_metadata"):
        dataclasses.replace(nixl_info(), nixl_metadata=None)
    with pytest.raises(ValueError, match="tcp_host and tcp_port"):
        dataclasses.replace(nixl_info(), transport=TransportKind.TCP)
    with pytest.raises(ValueError, match="mem_type"):
        dataclasses.replace(nixl_info(), mem_type="HBM")


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"node_name": "a b"}, "node_name"),
        ({"transport": "rdma"}, "transport"),
        ({"tcp_port": 70000}, "tcp_port"),
        ({"deadline_s": 0}, "deadline_s"),
        ({"poll_interval_s": -1}, "poll_interval_s"),
        ({"progress_wakeup_us": 0}, "progress_wakeup_us"),
    ],
)
def test_config_errors_name_the_field(fields: dict[str, object], name: str) -> None:
    base: dict[str, object] = {"node_name": "n"}
    with pytest.raises(ValueError, match=f"TransferConfig.{name}"):
        TransferConfig(**{**base, **fields})  # type: ignore[arg-type]
