"""What both legs of a request's flow work with: the router's state, the request, its
prefix query, its deadline and its KV lease."""

from __future__ import annotations

from collections.abc import Sequence

from cluster.node_records import NodeRecord
from router.flow.lease import KVLease
from router.flow.request import Deadline, FlowRequest
from router.routing.prefix_index import PrefixQuery
from router.state import RouterState
from router.trail import Trail


class Leg:
    """A leg of one request's flow (prefill or decode)."""

    def __init__(
        self,
        state: RouterState,
        request: FlowRequest,
        query: PrefixQuery,
        deadline: Deadline,
        lease: KVLease,
        trail: Trail,
    ) -> None:
        self._s = state
        self._request = request
        self._query = query
        self._deadline = deadline
        self._lease = lease
        self._trail = trail

    def _route(self, pool: str, candidates: Sequence[NodeRecord], skip: set[str]) -> None:
        """Enter the trail's `route` phase; a traced one shows each candidate's cost terms."""
        trail = self._trail
        trail.enter("route", attrs={"splitserve.pool": pool})
        if trail.tracer.enabled:
            left = [c for c in candidates if c.info.node_id not in skip]
            costs = self._s.picker.costs(pool, left, self._query)
            trail.annotate({f"splitserve.cost.{k}": v.text() for k, v in costs.items()})
