"""Transfer agent settings: one frozen dataclass, validated at construction. The fields
declared with `setting(...)` are a node's settings too (config_kit)."""

from __future__ import annotations

from dataclasses import dataclass, field

from config_kit import Helm, Up, check_fields, setting

TRANSPORTS = ("auto", "nixl", "tcp")


@dataclass(frozen=True)
class TransferConfig:
    """How a node moves KV blocks.

    transport: "auto" (NIXL when importable, else TCP), "nixl" or "tcp".
    tcp_host / tcp_port: where the TCP block server listens (port 0: any free port).
    advertise_host: the address peers dial (default: tcp_host; set it when binding 0.0.0.0).
    deadline_s: default deadline of one READ.
    ucx_tls: UCX_TLS to use when the environment sets none; None leaves UCX to choose.
    progress_wakeup_us: periodic wakeup of the serving NIXL agent's progress thread, which
        sleeps on UCX events in between; it bounds the delay if UCX misses an event.
    hugepages: back a CPU KV tensor with transparent huge pages at registration (best effort).
    poll_interval_s: how often the owner drains release notifications and expires leases.
    token: the cluster token a reader must show in its TCP HELLO (None: no check). Never in
        repr or logs.
    """

    node_name: str
    transport: str = setting(
        "auto", "KV transport: nixl, tcp, or auto (NIXL when available)", name="transfer",
        choices=TRANSPORTS,
    )  # fmt: skip
    tcp_host: str = "127.0.0.1"
    tcp_port: int = setting(
        0, "TCP port of the KV block server (0: any free port)", name="transfer_port", ge=0,
        le=65535, up=Up.OWN, helm=Helm.CHART,
    )  # fmt: skip
    advertise_host: str | None = None
    deadline_s: float = 5.0
    ucx_tls: str | None = None
    progress_wakeup_us: int = 100_000
    hugepages: bool = True
    poll_interval_s: float = 0.02
    token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.node_name or any(c.isspace() for c in self.node_name):
            raise ValueError(
                f"TransferConfig.node_name must be a non-empty word: {self.node_name!r}"
            )
        for name in ("deadline_s", "poll_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"TransferConfig.{name} must be > 0, got {getattr(self, name)!r}")
        if self.token is not None and not self.token:
            raise ValueError("TransferConfig.token must be None or a non-empty string")
        if self.progress_wakeup_us < 1:
            raise ValueError(
                f"TransferConfig.progress_wakeup_us must be >= 1, got {self.progress_wakeup_us}"
            )

    @property
    def dial_host(self) -> str:
        return self.advertise_host or self.tcp_host
