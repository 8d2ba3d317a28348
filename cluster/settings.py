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
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from cluster.auth import ApiKey, named_keys, read_key_file, split_keys
from cluster.key_limits import EVERY_KEY, KeyLimit, parse_key_limits
from cluster.tracing import TraceConfig, configured_endpoint
from models.lora_modules import lora_module_map

ENV_PREFIX = "SPLITSERVE_"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


class SettingsError(ValueError):
    """Invalid settings; the message names every bad field."""


class _Base(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="forbid", protected_namespaces=()
    )


class _Tracing(_Base):
    """OpenTelemetry traces (cluster.tracing), on the router and every node."""

    # OTLP endpoint of a collector (Jaeger, Tempo): `http://host:4318` or the full traces
    # URL; unset: the OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT variables, else no tracing
    otlp_traces_endpoint: str | None = Field(default=None, min_length=1)
    # share of requests traced (a client's `traceparent` decides for its own requests)
    trace_sample_ratio: float = Field(default=1.0, ge=0, le=1)

    @field_validator("otlp_traces_endpoint")
    @classmethod
    def _check_endpoint(cls, url: str | None) -> str | None:
        if url is not None and urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"must be an http(s) URL such as http://localhost:4318, got {url!r}")
        return url

    def trace_config(self, service: str, instance: str) -> TraceConfig:
        return TraceConfig(
            configured_endpoint(self.otlp_traces_endpoint), self.trace_sample_ratio,
            f"splitserve-{service}", instance,
        )  # fmt: skip


class RouterSettings(_Tracing):
    """The OpenAI-compatible router."""

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    redis_url: str = DEFAULT_REDIS_URL
    model: str = "smollm2"  # registry name or path of a HF model dir (for the tokenizer)
    model_cache: Path | None = None  # model cache dir, as in models
    served_model_name: str | None = None  # the `model` clients send; default: model's name
    # LoRA adapters served at start, name=path (the same list the nodes load); a request's
    # `model` names one. More are added by POST /v1/load_lora_adapter.
    lora_modules: list[str] = Field(default_factory=list)
    # When set, /v1/* needs `Authorization: Bearer <key>`: one key, or several separated by
    # commas; api_key_file adds one key per line.
    # Either may name its keys, `name:key`: usage is counted by key name.
    api_key: SecretStr | None = None
    api_key_file: Path | None = None
    # Key names that may read GET /v1/usage (comma-separated).
    usage_admin_keys: str | None = None
    # Requests / tokens per minute by key name (cluster.key_limits): `alice:rpm=60,tpm=20000`
    key_limits: str | None = None
    cluster_token: SecretStr | None = None  # sent to the nodes on every /internal/* call
    # kv_aware: the prefix index (nodes' KV events) against load; with one node per pool
    # every policy picks that node.
    policy: Literal["round_robin", "least_loaded", "kv_aware"] = "kv_aware"
    # kv_aware cost (router/routing/kv_cost.py): prefix * tokens to compute + a request's average
    # work * (load * queued requests + usage * KV usage)
    kv_prefix_weight: float = Field(default=1.0, ge=0)
    kv_load_weight: float = Field(default=0.5, ge=0)
    kv_usage_weight: float = Field(default=0.5, ge=0)
    # a prompt token a node holds in host memory / on disk (KV tiers), in tokens to compute
    kv_host_weight: float = Field(default=0.1, ge=0, le=1)
    kv_disk_weight: float = Field(default=0.3, ge=0, le=1)
    # Prompts with fewer tokens than this skip the prefill pool: the decode node prefills
    # locally (a 32-token prompt costs about as much as a KV transfer round trip). 0 = never.
    local_prefill_max_tokens: int = Field(default=32, ge=0)
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    request_timeout_s: float = Field(default=600.0, gt=0)  # whole request, first byte to last
    prefill_timeout_s: float = Field(default=60.0, gt=0)  # one /internal/prefill call
    decode_idle_timeout_s: float = Field(default=30.0, gt=0)  # max silence on a decode stream
    connect_timeout_s: float = Field(default=2.0, gt=0)
    prefill_attempts: int = Field(default=3, ge=1)  # prefill nodes tried before giving up
    # decode nodes that may fail or take a request (a resume counts); a busy one is tried again
    decode_attempts: int = Field(default=2, ge=1)
    # requests served at once (fewer when the pools report they hold fewer); more wait
    max_inflight: int = Field(default=512, ge=1)
    max_queued: int = Field(default=1024, ge=0)  # requests waiting for a slot; more -> 429
    max_queue: int = Field(default=256, ge=1)  # per-node waiting requests; all nodes over -> 429
    retry_after_s: int = Field(default=1, ge=1)
    membership_poll_s: float = Field(default=1.0, gt=0)
    max_model_len: int | None = Field(default=None, ge=1)  # default: smallest of the nodes'
    drain_timeout_s: float = Field(default=30.0, gt=0)  # after SIGTERM, for running streams
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # how tool calls are read from the output (vLLM's names); auto: by the chat template
    tool_call_parser: Literal["auto", "json", "hermes", "mistral"] = "auto"

    @model_validator(mode="after")
    def _check_keys(self) -> RouterSettings:
        names = {k.name for k in self.api_keys()}  # an unreadable key file fails at start
        unknown = (set(self.limits_by_key()) - {EVERY_KEY}) | self.admin_key_names()
        if unknown - names:
            raise ValueError(f"no API key is named {', '.join(sorted(unknown - names))}")
        _check_token(self.cluster_token)
        lora_module_map(self.lora_modules)
        return self

    def api_keys(self) -> tuple[ApiKey, ...]:
        """Every accepted API key with its name (empty: no key is needed)."""
        given = split_keys(self.api_key.get_secret_value()) if self.api_key else []
        if self.api_key is not None and not given:
            raise ValueError("api_key is set but holds no key")
        keys = named_keys(given, "api_key")
        if self.api_key_file is not None:
            lines = read_key_file(self.api_key_file)
            keys += named_keys(lines, f"the API key file {self.api_key_file}", len(keys) + 1)
        seen: set[str] = set()
        for key in keys:
            if key.name in seen:
                raise ValueError(f"two API keys are named {key.name!r}")
            seen.add(key.name)
        return tuple(keys)

    def limits_by_key(self) -> dict[str, KeyLimit]:
        return parse_key_limits(self.key_limits) if self.key_limits else {}

    def admin_key_names(self) -> set[str]:
        return set(split_keys(self.usage_admin_keys)) if self.usage_admin_keys else set()

    def model_name(self) -> str:
        """The name clients put in `model` and that /v1/models lists."""
        if self.served_model_name:
            return self.served_model_name
        return Path(self.model).name if ("/" in self.model or os.sep in self.model) else self.model


class NodeSettings(_Tracing):
    """A prefill, decode or colocated node."""

    host: str = "127.0.0.1"
    port: int = Field(default=8100, ge=1, le=65535)
    redis_url: str = DEFAULT_REDIS_URL
    model: str = "smollm2"
    model_cache: Path | None = None
    role: Literal["prefill", "decode", "colocated"] = "decode"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    # weights kept quantized: gguf (the model directory's *.gguf, packed), awq / gptq / fp8
    # (the checkpoint's quantization_config), none (its fp32 safetensors), auto (the
    # checkpoint's declared method, else gguf on a CPU fp32 node when the directory has one)
    quantization: Literal["auto", "none", "gguf", "awq", "gptq", "fp8"] = "auto"
    # torch's names: medium lets packed layers on AMX tiles take bf16 products (engine.config)
    float32_matmul_precision: Literal["highest", "medium"] = "highest"
    block_size: int = Field(default=16, ge=1, le=1024)
    # KV cache size: num_kv_blocks or kv_cache_memory_gb when set (not both); else on CUDA
    # gpu_memory_utilization of the device's memory minus the weights and activations; else 1 GiB
    num_kv_blocks: int | None = Field(default=None, ge=1)
    kv_cache_memory_gb: float | None = Field(default=None, gt=0)
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    # auto: the model dtype; int8 / fp8_e4m3: one-byte codes + a bf16 scale and mid per half row
    kv_cache_dtype: Literal["auto", "int8", "fp8_e4m3"] = "auto"
    # KV tiers below the device (engine.kv.offload): host GiB, and a directory with its GiB
    # for block files that survive a restart (needs the host tier)
    kv_offload_cpu_gb: float | None = Field(default=None, gt=0)
    kv_offload_disk_path: Path | None = None
    kv_offload_disk_gb: float | None = Field(default=None, gt=0)
    max_num_seqs: int | None = Field(default=None, ge=1)  # default: 256 on CUDA, 64 on CPU
    max_num_batched_tokens: int = Field(default=2048, ge=1)
    max_model_len: int | None = Field(default=None, ge=1)  # default: the model's
    # ranks of the node's engine (one process each under the node; GPUs = TP x PP)
    tensor_parallel_size: int = Field(default=1, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    transfer: Literal["auto", "nixl", "tcp"] = "auto"
    transfer_port: int = Field(default=0, ge=0, le=65535)  # 0 = pick a free port
    transfer_failure: Literal["recompute", "fail"] = "recompute"
    lease_ttl_s: float = Field(default=30.0, gt=0)
    # decode: KV imports wait for blocks in a queue this long at most (the request's own
    # deadline may be shorter); more than max_queued_imports waiting (default: the engine's
    # max_num_seqs) -> 503
    max_queued_imports: int | None = Field(default=None, ge=1)
    import_wait_s: float = Field(default=30.0, gt=0)
    heartbeat_s: float = Field(default=1.0, gt=0)
    ttl_s: float = Field(default=5.0, gt=0)  # registry key TTL; must exceed heartbeat_s
    node_id: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.-]+$"
    )
    advertise_host: str | None = None  # host in the URL others use; default: host
    torch_threads: int | None = Field(default=None, ge=1)
    # Speculative decoding on decode and colocated nodes (engine.speculative); the prefill
    # role ignores it. draft: a smaller model of the same vocabulary (registry name or dir).
    speculative_method: Literal["none", "ngram", "draft"] = "none"
    num_speculative_tokens: int = Field(default=4, ge=1, le=16)
    draft_model: str | None = Field(default=None, min_length=1)
    # Needed on every /internal/* call and on the KV transfer handshake when set.
    cluster_token: SecretStr | None = None
    # After SIGTERM: how long running requests get to finish (and leases to be pulled).
    drain_timeout_s: float = Field(default=30.0, gt=0)
    kv_events: bool = True  # publish prefix-cache changes for the routers' kv_aware policy
    kv_events_interval_s: float = Field(default=0.05, gt=0)
    kv_events_maxlen: int = Field(default=10_000, ge=16)  # entries kept in the node's stream
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Multi-LoRA (engine.lora): adapters loaded at start as name=path (PEFT directories);
    # more can be loaded at run time through the router.
    enable_lora: bool = False
    lora_modules: list[str] = Field(default_factory=list)
    max_loras: int = Field(default=1, ge=1)
    max_lora_rank: int = Field(default=16, ge=1)
    max_cpu_loras: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _check_relations(self) -> NodeSettings:
        if self.num_kv_blocks is not None and self.kv_cache_memory_gb is not None:
            raise ValueError("set num_kv_blocks or kv_cache_memory_gb, not both")
        _check_token(self.cluster_token)
        if (self.kv_offload_disk_path is None) != (self.kv_offload_disk_gb is None):
            raise ValueError("kv_offload_disk_path and kv_offload_disk_gb go together")
        if self.kv_offload_disk_path is not None and self.kv_offload_cpu_gb is None:
            raise ValueError("kv_offload_disk_path needs kv_offload_cpu_gb")
        if self.speculative_method == "draft" and self.draft_model is None:
            raise ValueError("speculative_method draft needs draft_model")
        if self.draft_model is not None and self.speculative_method != "draft":
            raise ValueError(
                f"draft_model is set but speculative_method is {self.speculative_method!r} "
                "(use draft)"
            )
        if self.ttl_s <= self.heartbeat_s:
            raise ValueError(
                f"ttl_s ({self.ttl_s}) must be greater than heartbeat_s ({self.heartbeat_s})"
            )
        lora_module_map(self.lora_modules, self.enable_lora)
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


def _check_token(token: SecretStr | None) -> None:
    if token is not None and len(token.get_secret_value()) < 16:
        raise ValueError("cluster_token must be at least 16 characters")


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
