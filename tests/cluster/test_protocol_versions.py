"""The wire protocol's version: what a message without it means (release 0.1.0: version 0),
which bodies a node refuses, and which nodes the router's membership leaves out."""

from __future__ import annotations

import json
import logging

import pytest
from pydantic import ValidationError

from cluster.node_records import NodeRecord
from cluster.protocol import (
    PROTOCOL_VERSION,
    AbortRequest,
    DecodeRequest,
    PrefillRequest,
    ReleaseRequest,
)
from cluster.registry import StaticMembership
from tests.cluster.test_registry import _info


def _body(cls: type, version: int | None) -> str:
    fields: dict[str, object] = {"request_id": "r"}
    if cls in (PrefillRequest, DecodeRequest):
        fields.update(prompt_token_ids=[1], sampling={"max_tokens": 4})
    if version is not None:
        fields["protocol_version"] = version
    return json.dumps(fields)


BODIES = [PrefillRequest, DecodeRequest, ReleaseRequest, AbortRequest]


@pytest.mark.parametrize("cls", BODIES)
def test_a_body_of_release_0_1_0_is_version_0_and_served(cls: type) -> None:
    assert cls.model_validate_json(_body(cls, None)).protocol_version == 0


@pytest.mark.parametrize("cls", BODIES)
@pytest.mark.parametrize("version", [PROTOCOL_VERSION + 2, PROTOCOL_VERSION + 5])
def test_a_body_two_versions_apart_is_refused_naming_the_field(cls: type, version: int) -> None:
    with pytest.raises(ValidationError) as caught:
        cls.model_validate_json(_body(cls, version))
    (error,) = caught.value.errors()
    assert error["loc"] == ("protocol_version",)
    assert f"protocol version {version} is more than one version" in error["msg"]


def test_a_record_without_a_version_is_version_0() -> None:
    assert _info("d0").protocol_version == 0


def test_the_membership_leaves_out_nodes_two_versions_apart_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    versions = {"d-old": 0, "d-new": PROTOCOL_VERSION, "d-far": PROTOCOL_VERSION + 2}
    records = [
        NodeRecord(info=_info(n).model_copy(update={"protocol_version": v}), heartbeat_at=1.0)
        for n, v in versions.items()
    ]
    with caplog.at_level(logging.WARNING, logger="splitserve"):
        members = StaticMembership(records)
        members.update(records)  # logged once per node and version
    assert [r.info.node_id for r in members.nodes()] == ["d-new", "d-old"]
    assert members.incompatible() == ["d-far"]
    assert len(members.all_nodes()) == 3
    lines = [r.getMessage() for r in caplog.records if "node_incompatible" in r.getMessage()]
    assert lines == [
        f"node_incompatible node=d-far protocol_version={PROTOCOL_VERSION + 2} "
        f"ours={PROTOCOL_VERSION} routed=false"
    ]
