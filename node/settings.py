"""A node's settings: its own, the engine's (engine.config.EngineConfig) and the transfer
agent's (kv_transfer.TransferConfig), composed: one set of flags, SPLITSERVE_* variables,
`up` flags and chart keys, generated from the three components' declarations (config_kit).
The engine's and the transfer agent's are held as given (`Given`) and checked by their own
component; the engine fills in its device's defaults when the node builds it."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Literal

from cluster.settings import ModelProcessSettings
from config_kit import Given, Helm, Up, part, setting
from engine.config import EngineConfig
from kv_transfer.config import TransferConfig
from models.lora_modules import LoraModules


@dataclass(frozen=True)
class NodeSettings(ModelProcessSettings, LoraModules):
    """A prefill, decode or colocated node (its LoRA adapters to load at start: LoraModules;
    more can be loaded at run time through the router)."""

    port: int = setting(8100, "HTTP port", ge=1, le=65535, up=Up.OWN, helm=Helm.CHART)
    role: Literal["prefill", "decode", "colocated"] = setting(
        "decode", "what the node serves (the subcommand's; `decode` serves decode or colocated)",
        command=True, up=Up.OWN, helm=Helm.CHART,
    )  # fmt: skip
    transfer_failure: str = setting(
        "recompute", "decode: what a failed KV transfer does", choices=("recompute", "fail")
    )
    lease_ttl_s: float = setting(30.0, "prefill: seconds a KV lease lives without a release", gt=0)
    # decode: KV imports wait for blocks in a queue this long at most (the request's own
    # deadline may be shorter); more than max_queued_imports waiting (default: the engine's
    # max_num_seqs) -> 503
    max_queued_imports: int | None = setting(
        None, "decode: KV imports that may wait for blocks at once (default: --max-num-seqs)",
        ge=1,
    )  # fmt: skip
    import_wait_s: float = setting(
        30.0, "decode: longest wait of a KV import for blocks (then 503)", gt=0
    )
    heartbeat_s: float = setting(1.0, "seconds between registry heartbeats", gt=0)
    ttl_s: float = setting(
        5.0, "registry TTL: the node disappears this long after its last heartbeat (more than "
        "--heartbeat-s)", gt=0,
    )  # fmt: skip
    node_id: str | None = setting(
        None, "node id in the registry (default: ROLE-HOSTNAME-PORT)",
        pattern=r"[A-Za-z0-9_.-]{1,128}", up=Up.OWN, helm=Helm.CHART,
    )  # fmt: skip
    advertise_host: str | None = setting(
        None, "host others use to reach this node (default: --host)", up=Up.OWN,
        helm=Helm.CHART,
    )  # fmt: skip
    torch_threads: int | None = setting(
        None, "torch CPU threads of the engine", ge=1, aliases=("threads_per_node",)
    )
    kv_events: bool = setting(True, "publish prefix-cache changes for the routers' kv_aware policy")
    kv_events_interval_s: float = setting(0.05, "seconds between KV event batches", gt=0)
    kv_events_maxlen: int = setting(10_000, "entries kept in the node's KV event stream", ge=16)
    engine: Given[EngineConfig] = part(EngineConfig)
    transfer: Given[TransferConfig] = part(TransferConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ttl_s <= self.heartbeat_s:
            raise ValueError(
                f"ttl_s ({self.ttl_s}) must be greater than heartbeat_s ({self.heartbeat_s})"
            )
        LoraModules.__post_init__(self)

    def resolved_node_id(self) -> str:
        """node_id, or `<role>-<hostname>-<port>` when unset."""
        return self.node_id or f"{self.role}-{socket.gethostname()}-{self.port}"

    def url(self) -> str:
        """Base URL the router and peers use to reach this node."""
        host = self.advertise_host or self.host
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        return f"http://{host}:{self.port}"
