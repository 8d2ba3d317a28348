"""What a node publishes about itself: its identity and sizes at registration (``NodeInfo``),
its load on every heartbeat (``NodeLoad``), the registry's value per node (``NodeRecord``)
and its ``GET /stats`` answer (``NodeStats``)."""

from __future__ import annotations

from pydantic import Field

from cluster.protocol import NodeRole, _Msg, _Versioned


class NodeInfo(_Versioned):
    """What a node publishes once at registration (and again on every heartbeat).

    url: base URL the router calls, e.g. "http://10.0.0.5:8101". capacity: KV blocks in
    total; kv_capacity_tokens and kv_cache_bytes: the same cache in tokens and bytes.
    started_at: unix time the process started (a restart changes it). architecture, layout:
    the model's class and its KV layout in words (what differs between two nodes' layouts);
    weight_bytes: the model's weights held by the node, expert_weight_bytes the experts'
    share of them (mixture-of-experts models). import_fingerprints: the other KV layouts a
    decode node imports from, converting them (the same layout in another kv_cache_dtype).
    max_num_seqs: requests its engine runs at once; max_queued: requests it lets wait for a
    place beyond those (a decode node's KV import queue). 0: not reported (an older node).
    The router sizes its admission from them (router.capacity).
    """

    node_id: str
    role: NodeRole
    url: str
    model: str
    layout_fingerprint: str
    peer_info: str = ""
    max_model_len: int = Field(ge=1)
    capacity: int = Field(ge=0)
    started_at: float
    kv_capacity_tokens: int = Field(default=0, ge=0)
    kv_cache_bytes: int = Field(default=0, ge=0)
    architecture: str = ""
    layout: str = ""
    weight_bytes: int = Field(default=0, ge=0)
    expert_weight_bytes: int = Field(default=0, ge=0)
    import_fingerprints: list[str] = Field(default_factory=list)
    max_num_seqs: int = Field(default=0, ge=0)
    max_queued: int = Field(default=0, ge=0)


class NodeLoad(_Msg):
    """A node's load, sent with every heartbeat. kv_usage = 1 - free_blocks / total_blocks."""

    running: int = 0
    waiting: int = 0
    free_blocks: int = 0
    total_blocks: int = 0
    leases_held: int = 0
    kv_usage: float = Field(default=0.0, ge=0.0, le=1.0)


class NodeRecord(_Msg):
    """The registry's value per node: info + latest load + when the node wrote it
    (node's unix time; the router only compares it for change, never across clocks)."""

    info: NodeInfo
    load: NodeLoad = Field(default_factory=NodeLoad)
    heartbeat_at: float


class NodeStats(_Msg):
    """GET /stats on a node: identity, load, and monotonically increasing counters
    (e.g. "requests_total", "transfer_failures_total"), free-form by name."""

    info: NodeInfo
    load: NodeLoad
    counters: dict[str, float] = Field(default_factory=dict)
