"""What NIXL itself reports of a transfer, for the reader's transfer span.

NIXL 1.5.1's Python API tells, per transfer handle: the backend that carried it
(`query_xfer_backend`: "UCX" here, the only backend the agents start) and, on an agent made
with `capture_telemetry`, `get_xfer_telemetry`: µs spent posting, µs from the start of the
post until NIXL saw the transfer complete (at a status check: the driver's polling), bytes
and descriptors after NIXL merged adjacent ones. It does not tell which UCX transport (cma,
tcp, rc, cuda_ipc, ...) moved the bytes: UCX picks one per endpoint and NIXL exposes neither
that choice nor UCX's endpoint info; `UCX_PROTO_INFO=y` makes UCX print it to the log.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from kv_transfer.transport import Facts

logger = logging.getLogger(__name__)

PREFIX = "splitserve.nixl."


class XferReport(NamedTuple):
    backend: str
    post_us: int
    xfer_us: int
    nbytes: int
    descs: int


def read_report(agent: Any, handle: Any) -> XferReport | None:
    """NIXL's report of a completed transfer (before its handle is released); None when
    this NIXL has no telemetry for it."""
    try:
        backend = str(agent.query_xfer_backend(handle))
        tel = agent.get_xfer_telemetry(handle)
        return XferReport(backend, int(tel.postDuration), int(tel.xferDuration),
                          int(tel.totalBytes), int(tel.descCount))  # fmt: skip
    except Exception as exc:  # telemetry off in this agent, or an older NIXL
        logger.debug("no NIXL telemetry for a transfer: %s", exc)
        return None


def merged(facts: Facts, report: XferReport) -> dict[str, str | int | float]:
    """`facts` (the READ's transfers so far) with one more: counts and bytes add up; the
    transfers run at once, so the longest post and transfer times stand for the READ."""
    out = dict(facts)

    def num(key: str) -> int:
        value = out.get(PREFIX + key, 0)
        return value if isinstance(value, int) else 0

    backends = {str(out[PREFIX + "backend"])} if PREFIX + "backend" in out else set()
    out[PREFIX + "backend"] = ",".join(sorted(backends | {report.backend}))
    out[PREFIX + "transfers"] = num("transfers") + 1
    out[PREFIX + "bytes"] = num("bytes") + report.nbytes
    out[PREFIX + "descs"] = num("descs") + report.descs
    out[PREFIX + "post_us"] = max(num("post_us"), report.post_us)
    out[PREFIX + "xfer_us"] = max(num("xfer_us"), report.xfer_us)
    return out
