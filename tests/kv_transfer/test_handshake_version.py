"""The KV handshake's protocol version: an owner serves a reader one version older (release
0.1.0 sends no version: 0) and refuses one further apart, naming both versions; PeerInfo's
JSON stays readable by 0.1.0, and a newer sender's keys are left out when read."""

from __future__ import annotations

import dataclasses
import json
import socket
from collections.abc import Iterator

import pytest
import torch

from cluster import protocol
from kv_transfer import KVTransferAgent, PeerInfo, TransferRefused, tcp_client, version
from kv_transfer.tcp_protocol import Kind, recv_json, send_json
from tests.kv_transfer.test_agent import tcp_agent

# The keys release 0.1.0's PeerInfo.from_json accepts (it refuses any other).
V0_KEYS = {
    "v", "node_name", "incarnation", "transport", "fingerprint", "layout", "num_blocks",
    "block_bytes", "mem_type", "device_id", "base_address", "nixl_metadata", "tcp_host",
    "tcp_port", "num_kv_heads", "shards",
}  # fmt: skip


@pytest.fixture
def owner() -> Iterator[KVTransferAgent]:
    agent = tcp_agent("owner")
    yield agent
    agent.close()


def _hello(owner: KVTransferAgent, **extra: object) -> tuple[Kind, dict[str, object]]:
    info = owner.info
    assert info.tcp_host is not None and info.tcp_port is not None
    with socket.create_connection((info.tcp_host, info.tcp_port), timeout=10) as sock:
        hello = {"agent": "r.1", "fingerprint": info.fingerprint, "layout": info.layout}
        send_json(sock, Kind.HELLO, {**hello, "expect": info.incarnation, **extra})
        return recv_json(sock)


def test_the_two_packages_hold_one_protocol_version() -> None:
    assert version.PROTOCOL_VERSION == protocol.PROTOCOL_VERSION
    pairs = [(a, b) for a in range(4) for b in range(4)]
    assert [version.compatible(a, b) for a, b in pairs] == [
        protocol.compatible(a, b) for a, b in pairs
    ]


def test_an_owner_welcomes_a_reader_one_version_older(owner: KVTransferAgent) -> None:
    kind, body = _hello(owner)  # release 0.1.0's HELLO: no version
    assert (kind, body["protocol"]) == (Kind.WELCOME, version.PROTOCOL_VERSION)
    kind, _ = _hello(owner, protocol=version.PROTOCOL_VERSION - 1)
    assert kind is Kind.WELCOME


@pytest.mark.parametrize("theirs", [version.PROTOCOL_VERSION + 2, "1", -1])
def test_an_owner_refuses_a_reader_two_versions_apart(
    owner: KVTransferAgent, theirs: object
) -> None:
    kind, body = _hello(owner, protocol=theirs)
    assert (kind, body["code"]) == (Kind.ERROR, "protocol")
    assert "protocol version" in str(body["message"])


async def test_a_reader_two_versions_newer_is_refused_with_both_versions(
    owner: KVTransferAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = tcp_agent("reader")
    try:
        monkeypatch.setattr(tcp_client, "PROTOCOL_VERSION", version.PROTOCOL_VERSION + 2)
        with pytest.raises(TransferRefused, match=r"protocol version 3 .* node's 1"):
            await reader.read_blocks(owner.info, [2], [0], request_id="r")
        monkeypatch.setattr(tcp_client, "PROTOCOL_VERSION", version.PROTOCOL_VERSION)
        await reader.read_blocks(owner.info, [2], [0], request_id="r2")
        assert torch.equal(reader.region.kv[0], owner.region.kv[2])
    finally:
        reader.close()


def test_peer_info_stays_readable_by_release_0_1_0(owner: KVTransferAgent) -> None:
    assert set(json.loads(owner.info.to_json())) <= V0_KEYS
    assert PeerInfo.from_json(owner.info.to_json()) == owner.info  # what it states reads back


def test_peer_info_states_its_protocol_from_version_2_and_drops_unknown_keys(
    owner: KVTransferAgent,
) -> None:
    newer = dataclasses.replace(owner.info, protocol=2)
    fields = json.loads(newer.to_json())
    assert fields["protocol"] == 2
    read = PeerInfo.from_json(json.dumps({**fields, "a_later_field": [1]}))
    assert read == newer
