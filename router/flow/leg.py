"""What both legs of a request's flow work with: the router's state, the request, its
prefix query, its deadline and its KV lease."""

from __future__ import annotations

from router.flow.lease import KVLease
from router.flow.request import Deadline, FlowRequest
from router.routing.prefix_index import PrefixQuery
from router.state import RouterState


class Leg:
    """A leg of one request's flow (prefill or decode)."""

    def __init__(
        self,
        state: RouterState,
        request: FlowRequest,
        query: PrefixQuery,
        deadline: Deadline,
        lease: KVLease,
    ) -> None:
        self._s = state
        self._request = request
        self._query = query
        self._deadline = deadline
        self._lease = lease
