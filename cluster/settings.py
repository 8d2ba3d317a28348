"""Settings of the router and of the nodes: environment variables `SPLITSERVE_<FIELD>`
(e.g. SPLITSERVE_REDIS_URL), overridden by keyword arguments (the CLI flags).

Both are frozen and validated at construction. `load(cls, **overrides)` turns a pydantic
ValidationError into a SettingsError whose message names each bad field and its variable.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "SPLITSERVE_"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


class SettingsError(ValueError):
    """Invalid settings; the message names every bad field."""


class _Base(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="forbid", protected_namespaces=()
    )


class RouterSettings(_Base):
    """The OpenAI-compatible router."""

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    redis_url: str = DEFAULT_REDIS_URL
    model: str = "smollm2"  # registry name or path of a HF model dir (for the tokenizer)
    model_cache: Path | None = None  # model cache dir, as in models
    served_model_name: str | None = None  # the `model` clients send; default: model's name
    api_key: SecretStr | None = None  # when set, /v1/* needs `Authorization: Bearer <key>`
    # kv_aware: the prefix index (nodes' KV events) against load; with one node per pool
    # every policy picks that node.
    policy: Literal["round_robin", "least_loaded", "kv_aware"] = "kv_aware"
    # kv_aware cost (router/kv_policy.py): prefix * tokens to compute + a request's average
    # work * (load * queued requests + usage * KV usage)
    kv_prefix_weight: float = Field(default=1.0, ge=0)
    kv_load_weight: float = Field(default=0.5, ge=0)
    kv_usage_weight: float = Field(default=0.5, ge=0)
    # Prompts with fewer tokens than this skip the prefill pool: the decode node prefills
    # locally (a 32-token prompt costs about as much as a KV transfer round trip). 0 = never.
    local_prefill_max_tokens: int = Field(default=32, ge=0)
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    request_timeout_s: float = Field(default=600.0, gt=0)  # whole request, first byte to last
    prefill_timeout_s: float = Field(default=60.0, gt=0)  # one /internal/prefill call
    decode_idle_timeout_s: float = Field(default=30.0, gt=0)  # max silence on a decode stream
    connect_timeout_s: float = Field(default=2.0, gt=0)
    prefill_attempts: int = Field(default=3, ge=1)  # prefill nodes tried before giving up
    decode_attempts: int = Field(default=2, ge=1)  # decode nodes tried (a resume counts)
    max_inflight: int = Field(default=512, ge=1)  # concurrent requests; more -> 429
    max_queue: int = Field(default=256, ge=1)  # per-node waiting requests; all nodes over -> 429
    retry_after_s: int = Field(default=1, ge=1)
    membership_poll_s: float = Field(default=1.0, gt=0)
    max_model_len: int | None = Field(default=None, ge=1)  # default: smallest of the nodes'
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    def model_name(self) -> str:
        """The name clients put in `model` and that /v1/models lists."""
        if self.served_model_name:
            return self.served_model_name
        return Path(self.model).name if ("/" in self.model or os.sep in self.model) else self.model


class NodeSettings(_Base):
    """A prefill, decode or colocated node."""

    host: str = "127.0.0.1"
    port: int = Field(default=8100, ge=1, le=65535)
    redis_url: str = DEFAULT_REDIS_URL
    model: str = "smollm2"
    model_cache: Path | None = None
    role: Literal["prefill", "decode", "colocated"] = "decode"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    block_size: int = Field(default=16, ge=1, le=1024)
    # KV cache size: num_kv_blocks or kv_cache_memory_gb when set (not both); else on CUDA
    # gpu_memory_utilization of the device's memory minus the weights and activations; else 1 GiB
    num_kv_blocks: int | None = Field(default=None, ge=1)
    kv_cache_memory_gb: float | None = Field(default=None, gt=0)
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    max_num_seqs: int | None = Field(default=None, ge=1)  # default: 256 on CUDA, 64 on CPU
    max_num_batched_tokens: int = Field(default=2048, ge=1)
    max_model_len: int | None = Field(default=None, ge=1)  # default: the model's
    transfer: Literal["auto", "nixl", "tcp"] = "auto"
    transfer_port: int = Field(default=0, ge=0, le=65535)  # 0 = pick a free port
    transfer_failure: Literal["recompute", "fail"] = "recompute"
    lease_ttl_s: float = Field(default=30.0, gt=0)
    heartbeat_s: float = Field(default=1.0, gt=0)
    ttl_s: float = Field(default=5.0, gt=0)  # registry key TTL; must exceed heartbeat_s
    node_id: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.-]+$"
    )
    advertise_host: str | None = None  # host in the URL others use; default: host
    torch_threads: int | None = Field(default=None, ge=1)
    kv_events: bool = True  # publish prefix-cache changes for the routers' kv_aware policy
    kv_events_interval_s: float = Field(default=0.05, gt=0)
    kv_events_maxlen: int = Field(default=10_000, ge=16)  # entries kept in the node's stream
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @model_validator(mode="after")
    def _check_relations(self) -> NodeSettings:
        if self.num_kv_blocks is not None and self.kv_cache_memory_gb is not None:
            raise ValueError("set num_kv_blocks or kv_cache_memory_gb, not both")
        if self.ttl_s <= self.heartbeat_s:
            raise ValueError(
                f"ttl_s ({self.ttl_s}) must be greater than heartbeat_s ({self.heartbeat_s})"
            )
        return self

    def resolved_node_id(self) -> str:
        """node_id, or `<role>-<hostname>-<port>` when unset."""
        return self.node_id or f"{self.role}-{socket.gethostname()}-{self.port}"

    def url(self) -> str:
        """Base URL the router and peers use to reach this node."""
        host = self.advertise_host or self.host
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        return f"http://{host}:{self.port}"


S = TypeVar("S", bound=_Base)


def load(cls: type[S], **overrides: Any) -> S:
    """Build settings from the environment plus non-None overrides, or raise SettingsError."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return cls(**given)
    except ValidationError as exc:
        raise SettingsError(_describe(cls, exc)) from None


def _describe(cls: type[_Base], exc: ValidationError) -> str:
    lines = [f"invalid {cls.__name__}:"]
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"])
        where = f"{field} (env {ENV_PREFIX}{field.upper()})" if field else "settings"
        lines.append(f"  {where}: {err['msg']}")
    return "\n".join(lines)
