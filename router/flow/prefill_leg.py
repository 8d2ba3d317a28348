"""The prefill leg: token 1 and a KV handle from the prefill pool, trying other prefill nodes
when one fails."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from cluster.node_records import NodeInfo, NodeRecord
from cluster.protocol import PROTOCOL_VERSION, PrefillRequest, PrefillResponse
from router.errors import overloaded
from router.flow.failures import node_failed, refused
from router.flow.leg import Leg
from router.node_client import NodeCallError


class Prefilled(NamedTuple):
    """The prefill node that answered, and its answer."""

    node: NodeInfo
    answer: PrefillResponse


class PrefillLeg(Leg):
    """Prefill one request on the prefill pool, up to `prefill_attempts` nodes."""

    async def run(self, candidates: Sequence[NodeRecord]) -> Prefilled | None:
        """The first answer, or None when no node could prefill. Raises APIError: 429 when
        every node tried was busy, 400 when one refused the request, on the deadline."""
        req = PrefillRequest(
            request_id=self._request.request_id,
            prompt_token_ids=self._request.prompt_ids,
            sampling=self._request.sampling,
            priority=self._request.priority,
            lora=self._request.lora,
            protocol_version=PROTOCOL_VERSION,
        )
        state = self._s
        tried: set[str] = set()
        busy = 0
        while len(tried) < state.settings.prefill_attempts:
            self._route("prefill", candidates, tried)
            node = state.picker.pick("prefill", candidates, tried, self._query)
            if node is None:
                break
            node_id = node.info.node_id
            left = [c.info.node_id for c in candidates if c.info.node_id not in tried]
            predicted = state.kv.routed("prefill", self._query, node_id, left)
            if tried:
                state.metrics.prefill_retries.inc()
            tried.add(node_id)
            try:
                answer = await self._prefill_on(node.info, req)
            except NodeCallError as err:
                busy += err.kind == "busy"
                continue
            state.kv.record("prefill", node_id, predicted, answer.num_cached_tokens)
            return Prefilled(node.info, answer)
        if tried and busy == len(tried):
            raise overloaded("every prefill node is busy", state.settings.retry_after_s)
        return None

    async def _prefill_on(self, node: NodeInfo, req: PrefillRequest) -> PrefillResponse:
        picker, nodes = self._s.picker, self._s.require_nodes()
        picker.begin(node.node_id)
        span = self._trail.enter("prefill", node.node_id)
        try:
            answer = await nodes.prefill(node, req, self._deadline.at, span.headers())
            span.set({"splitserve.cached_tokens": answer.num_cached_tokens})
            return answer
        except NodeCallError as err:
            if err.kind == "deadline":  # the request's time, not the node's fault
                self._lease.release_unanswered(node)
                raise self._deadline.error() from None
            node_failed(self._s, req.request_id, "prefill", err)
            if err.kind == "refused":
                raise refused(err) from None
            if err.kind == "unreachable":  # maybe only slow: let it drop the lease now
                self._lease.release_unanswered(node)
            raise
        finally:
            picker.end(node.node_id)
