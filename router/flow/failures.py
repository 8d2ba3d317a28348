"""A failed node call as the flow reports it: counted, logged, the node marked, or a 400."""

from __future__ import annotations

import logging

from router.errors import APIError, bad_request
from router.node_client import NodeCallError
from router.state import RouterState

log = logging.getLogger("splitserve.router")


def node_failed(state: RouterState, request_id: str, role: str, err: NodeCallError) -> None:
    """Count and log the failure (a busy node, which the flow tries again, at debug level);
    an unreachable node is marked unhealthy."""
    state.metrics.node_errors.labels(role, err.kind).inc()
    log.log(
        logging.DEBUG if err.kind == "busy" else logging.WARNING,
        "node_call_failed id=%s role=%s node=%s kind=%s error=%s",
        request_id, role, err.node_id, err.kind, err,
    )  # fmt: skip
    if err.kind == "unreachable":
        state.membership.mark_unhealthy(err.node_id)


def refused(err: NodeCallError) -> APIError:
    """A node's 400 for the request, passed on to the client as its own."""
    info = err.info
    return bad_request(
        info.message if info else str(err), param=info.param if info else None, code="refused"
    )
