from __future__ import annotations

import dataclasses

import pytest

from kv_transfer import PeerInfo, TransferConfig, TransportKind


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
