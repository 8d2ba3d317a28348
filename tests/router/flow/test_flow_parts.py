"""The request flow's small parts on their own: the KV lease (released once, only while the
router holds it), the shared prompt of n > 1 siblings, the deadline and a sibling's request."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, cast

from cluster.node_records import NodeInfo, NodeRecord
from cluster.protocol import PROTOCOL_VERSION, KVHandle, PrefillResponse
from models.sampling_params import SamplingParams
from router.flow.decode_leg import kv_importers
from router.flow.lease import KVLease
from router.flow.request import Deadline, FlowRequest
from router.flow.shared_prompt import SharedPrompt
from router.state import RouterState


class _Nodes:
    def __init__(self) -> None:
        self.released: list[tuple[str, str]] = []

    async def release(self, node: NodeInfo, request_id: str) -> None:
        self.released.append((node.node_id, request_id))


class _State:
    """What KVLease uses of RouterState: spawn (run at once here) and the node client."""

    def __init__(self) -> None:
        self.nodes = _Nodes()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        asyncio.run(coro)

    def require_nodes(self) -> _Nodes:
        return self.nodes


def _node(node_id: str) -> NodeInfo:
    return NodeInfo(
        node_id=node_id, role="prefill", url="http://p", model="m", layout_fingerprint="fp",
        max_model_len=64, capacity=8, started_at=0.0,
    )  # fmt: skip


def _handle(fingerprint: str = "fp", protocol_version: int = PROTOCOL_VERSION) -> KVHandle:
    return KVHandle(
        node_id="p0", peer_info="", block_ids=[1], num_tokens=4, layout_fingerprint=fingerprint,
        lease_expires_at=1.0, protocol_version=protocol_version,
    )  # fmt: skip


def _answer(finished: bool) -> PrefillResponse:
    kv = _handle()
    return PrefillResponse(
        request_id="r", first_token_id=3, finished=finished, num_prompt_tokens=4,
        kv=None if finished else kv,
    )  # fmt: skip


def _lease() -> tuple[KVLease, _Nodes]:
    state = _State()
    return KVLease(cast(RouterState, state), "r"), state.nodes


def test_an_untaken_lease_is_released_once() -> None:
    lease, nodes = _lease()
    lease.granted(_node("p0"), _answer(finished=False))
    lease.release()
    lease.release()
    assert nodes.released == [("p0", "r")]


def test_no_lease_after_a_request_that_ended_at_token_1() -> None:
    lease, nodes = _lease()
    lease.release()  # nothing granted yet
    lease.granted(_node("p0"), _answer(finished=True))
    lease.release()
    assert nodes.released == []


def test_a_taken_lease_is_the_decode_nodes_until_its_import_fails() -> None:
    lease, nodes = _lease()
    lease.granted(_node("p0"), _answer(finished=False))
    lease.taken()
    lease.release()
    assert nodes.released == []
    lease.release_after_failed_import()
    lease.release_unanswered(_node("p1"))
    assert nodes.released == [("p0", "r"), ("p1", "r")]


async def test_the_shared_prompt_settles_once_and_wakes_the_siblings() -> None:
    shared = SharedPrompt()
    waiting = asyncio.create_task(shared.node_id())
    await asyncio.sleep(0)
    assert not waiting.done() and not shared.settled
    shared.settle("d1")
    shared.settle(None)  # sample 0 ending later changes nothing
    assert await waiting == "d1" and await shared.node_id() == "d1"


def test_the_deadline_is_the_shorter_of_the_two_limits() -> None:
    request = FlowRequest("r", [1, 2], SamplingParams(), arrived_at=100.0, timeout_s=5.0)
    own = Deadline.of(request, limit_s=60.0)
    assert own == Deadline(105.0, own=True) and own.error().status == 408
    router = Deadline.of(request, limit_s=2.0)
    assert router == Deadline(102.0, own=False) and router.error().status == 504
    plain = FlowRequest("r", [1], SamplingParams(), arrived_at=100.0)
    assert Deadline.of(plain, limit_s=60.0) == Deadline(160.0, own=False)


def test_a_sibling_request_has_its_own_id_and_sampling_and_skips_the_prompt_count() -> None:
    request = FlowRequest("r", [1, 2], SamplingParams(seed=1), arrived_at=0.0, priority=3)
    sibling = request.sibling(2, SamplingParams(seed=9))
    assert sibling.request_id == "r-2" and sibling.sampling.seed == 9
    assert not sibling.counts_prompt and request.counts_prompt
    assert (sibling.prompt_ids, sibling.priority) == (request.prompt_ids, 3)


def test_kv_goes_to_decode_nodes_of_its_layout_or_that_convert_it() -> None:
    """A decode node with another kv_cache_dtype publishes the layouts it converts."""
    same = _node("d-same")
    other = _node("d-other").model_copy(update={"layout_fingerprint": "int8"})
    converts = _node("d-conv").model_copy(
        update={"layout_fingerprint": "int8", "import_fingerprints": ["fp", "fp8"]}
    )
    records = [NodeRecord(info=n, heartbeat_at=0.0) for n in (same, other, converts)]
    assert [r.info.node_id for r in kv_importers(records, _handle())] == ["d-same", "d-conv"]
    assert kv_importers(records, _handle("bf16")) == []


def test_kv_goes_only_to_decode_nodes_at_most_one_protocol_version_from_its_writer() -> None:
    """Rolling upgrades: a node serves peers one version older; a pair further apart is
    never chosen (a handle without a version comes from release 0.1.0: version 0)."""
    nodes = [
        NodeRecord(info=_node(f"d-v{v}").model_copy(update={"protocol_version": v}), heartbeat_at=0)
        for v in (0, 1, 2)
    ]
    takers = {v: [r.info.node_id for r in kv_importers(nodes, _handle(protocol_version=v))]
              for v in (0, 1, 2)}  # fmt: skip
    assert takers == {0: ["d-v0", "d-v1"], 1: ["d-v0", "d-v1", "d-v2"], 2: ["d-v1", "d-v2"]}
    old = KVHandle.model_validate_json(_handle().model_dump_json(exclude={"protocol_version"}))
    assert old.protocol_version == 0
