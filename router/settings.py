"""The router's settings: flags of `splitserve router`, SPLITSERVE_* variables, `up` flags and
chart keys, all generated from these declarations (config_kit)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cluster.auth import ApiKey, named_keys, read_key_file, split_keys
from cluster.key_limits import EVERY_KEY, KeyLimit, parse_key_limits
from cluster.settings import ModelProcessSettings
from config_kit import Helm, Secret, Up, setting
from models.lora_modules import lora_module_map
from router.api.reasoning import REASONING_PARSERS
from router.api.tool_parsers import PARSER_NAMES


@dataclass(frozen=True)
class RouterSettings(ModelProcessSettings):
    """The OpenAI-compatible router."""

    port: int = setting(8000, "port to listen on", ge=1, le=65535, up=Up.OWN, helm=Helm.CHART)
    served_model_name: str | None = setting(
        None, "the model name clients send (default: the model's name)"
    )
    # LoRA adapters served at start, name=path (the same list the nodes load); a request's
    # `model` names one. More are added by POST /v1/load_lora_adapter.
    lora_modules: list[str] = setting(
        help="LoRA adapters a request's model may name (the nodes' --lora-modules)",
        factory=list, metavar="NAME=PATH", helm=Helm.CHART,
    )  # fmt: skip
    # When set, /v1/* needs `Authorization: Bearer <key>`: one key, or several separated by
    # commas; api_key_file adds one key per line. Either may name its keys, `name:key`: usage
    # is counted by key name. `up` hands it on in the router's environment, never its argv.
    api_key: Secret | None = setting(
        None, "require `Authorization: Bearer KEY` on /v1 (several: comma-separated, `name:key` "
        "names one); prefer SPLITSERVE_API_KEY, which other users cannot see in the process list",
        helm=Helm.CHART,
    )  # fmt: skip
    api_key_file: Path | None = setting(
        None, "accepted API keys, one per line: `name:key` (or a bare key)"
    )
    usage_admin_keys: str | None = setting(
        None, "key names that may read GET /v1/usage (comma-separated)"
    )
    key_limits: str | None = setting(
        None, "requests and tokens per minute by key name: `alice:rpm=60,tpm=20000;*:rpm=600`"
    )
    # kv_aware: the prefix index (nodes' KV events) against load; with one node per pool
    # every policy picks that node.
    policy: Literal["kv_aware", "least_loaded", "round_robin"] = setting(
        "kv_aware", "routing policy: kv_aware (prefix cache held against load), least_loaded or "
        "round_robin",
    )  # fmt: skip
    # kv_aware cost (router/routing/kv_cost.py): prefix * tokens to compute + a request's
    # average work * (load * queued requests + usage * KV usage)
    kv_prefix_weight: float = setting(
        1.0, "kv_aware: weight of the prompt tokens a node must compute", ge=0, helm=Helm.CHART
    )
    kv_load_weight: float = setting(
        0.5, "kv_aware: weight of a node's queued requests", ge=0, helm=Helm.CHART
    )
    kv_usage_weight: float = setting(
        0.5, "kv_aware: weight of a node's KV usage", ge=0, helm=Helm.CHART
    )
    kv_host_weight: float = setting(
        0.1, "kv_aware: a prompt token a node holds in host memory, in tokens to compute", ge=0,
        le=1, helm=Helm.CHART,
    )  # fmt: skip
    kv_disk_weight: float = setting(
        0.3, "kv_aware: a prompt token a node holds on disk, in tokens to compute", ge=0, le=1,
        helm=Helm.CHART,
    )  # fmt: skip
    local_prefill_max_tokens: int = setting(
        32, "prompts shorter than this skip the prefill pool: the decode node prefills them "
        "(about a KV transfer's round trip; 0: never)", ge=0,
    )  # fmt: skip
    max_body_bytes: int = setting(1 << 20, "largest request body, in bytes", ge=1024)
    request_timeout_s: float = setting(600.0, "deadline of one request, first byte to last", gt=0)
    prefill_timeout_s: float = setting(60.0, "deadline of one /internal/prefill call", gt=0)
    decode_idle_timeout_s: float = setting(30.0, "longest silence on a decode stream", gt=0)
    connect_timeout_s: float = setting(2.0, "deadline of a connection to a node", gt=0)
    prefill_attempts: int = setting(3, "prefill nodes tried before giving up", ge=1)
    decode_attempts: int = setting(2, "decode nodes tried (a resume counts)", ge=1)
    max_inflight: int = setting(512, "requests served at once; later ones wait in the queue", ge=1)
    max_queued: int = setting(1024, "requests waiting by (priority, arrival) before 429", ge=0)
    max_queue: int = setting(256, "waiting requests per node; every node over it: 429", ge=1)
    retry_after_s: int = setting(1, "Retry-After of a 429, in seconds", ge=1)
    membership_poll_s: float = setting(1.0, "seconds between registry reads", gt=0)
    max_model_len: int | None = setting(
        None, "context length (default: the smallest of the nodes')", ge=1
    )
    tool_call_parser: str = setting(
        "auto", "the format tool calls are read in (vLLM's names; default auto: the chat "
        "template's)", choices=PARSER_NAMES,
    )  # fmt: skip
    reasoning_parser: str | None = setting(
        None, "read a reasoning model's thinking apart from its answer (vLLM's names; default: "
        "none, the thinking stays in the answer)", choices=REASONING_PARSERS,
    )  # fmt: skip
    response_ttl_s: int = setting(
        86400, "seconds Redis keeps a stored Responses API response (store, "
        "previous_response_id)", ge=1,
    )  # fmt: skip
    pooling_type: Literal["last", "mean"] = setting(
        "last", "/v1/embeddings: a vector is the last token's final hidden state or the mean of "
        "every token's (vLLM's pooling types; a request's pooling_type overrides)",
    )  # fmt: skip
    pooling_normalize: bool = setting(
        True, "/v1/embeddings: scale vectors to unit length (a request's normalize overrides)"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        names = {k.name for k in self.api_keys()}  # an unreadable key file fails at start
        unknown = (set(self.limits_by_key()) - {EVERY_KEY}) | self.admin_key_names()
        if unknown - names:
            raise ValueError(f"no API key is named {', '.join(sorted(unknown - names))}")
        lora_module_map(self.lora_modules)
        if self.reasoning_parser == "gpt_oss" and self.tool_call_parser not in ("auto", "openai"):
            raise ValueError(
                "reasoning_parser 'gpt_oss' reads harmony output, whose tool calls "
                f"tool_call_parser 'openai' reads, not {self.tool_call_parser!r} (use auto or "
                "openai)"
            )

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
