"""The wire protocol between router, prefill nodes and decode nodes.

These pydantic models are the only types that cross process boundaries. Nodes deal in
token ids only; the router owns text. Field names are a contract: add fields with defaults,
never rename or repurpose one.

Endpoints (all JSON over HTTP, `Content-Type: application/json`):

- POST `/internal/prefill` (prefill nodes): `PrefillRequest` -> `PrefillResponse`
- POST `/internal/release` (prefill nodes): `ReleaseRequest` -> `ControlResponse`
- POST `/internal/generate` (decode and colocated nodes): `DecodeRequest` -> a stream of
  `TokenEvent`, one JSON object per line (NDJSON, `application/x-ndjson`)
- POST `/internal/abort` (decode and colocated nodes): `AbortRequest` -> `ControlResponse`
- GET `/stats` (every node): -> `NodeStats`
- GET `/health` (every node): 200 while the process serves
- GET `/ready` (every node): 200 while registered and not draining, else 503; the body's
  `status` ("ready", "draining", "not_ready") and `loaded` say why

Error answers (any endpoint, before a stream starts) carry an HTTP status and the body
`NodeErrorResponse`: 400 for a request the node refuses (bad ids, too long), 429 or 503 when
the node is overloaded or draining (the router tries another node), 500 for node bugs.
A decode node answers `/internal/generate` with its status line and headers as soon as it
has accepted (or refused) the request, before the first token, so the router tells refusal
from slowness. Once the stream has started, a failure is sent as a final `TokenEvent` with
`finished=true`, `finish_reason="error"` and `error` set. The router treats a stream that
ends without a finished event, or stays silent past its idle timeout, as a dead node.

Release and abort are idempotent: an unknown or already finished request id answers 200
with `done=false`.

Versions: node records (`NodeInfo`), KV handles and the router's request bodies carry
`protocol_version`, `PROTOCOL_VERSION` of the process that wrote them; a message without it
comes from version 0 (release 0.1.0). Two processes work together when their versions are at
most one apart (`compatible`): a node serves peers one version older, and refuses a body
further apart with 400 naming `protocol_version`. Change a message only so that a process one
version older or newer still reads it: new fields get defaults, nothing is renamed.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
)
from pydantic_core import InitErrorDetails

from models.sampling_params import InvalidSampling, SamplingParams

NodeRole = Literal["prefill", "decode", "colocated"]
INTERNAL_PREFILL = "/internal/prefill"
INTERNAL_RELEASE = "/internal/release"
INTERNAL_EMBED = "/internal/embed"  # EmbedRequest -> EmbedResponse (every node)
INTERNAL_GENERATE = "/internal/generate"
INTERNAL_ABORT = "/internal/abort"
INTERNAL_LORA_LOAD = "/internal/lora/load"  # LoadAdapterRequest -> ControlResponse
INTERNAL_LORA_UNLOAD = "/internal/lora/unload"
STATS = "/stats"
PRIORITY_LIMIT = 1_000_000  # priorities lie in [-PRIORITY_LIMIT, PRIORITY_LIMIT]
HEALTH = "/health"
READY = "/ready"  # 200 while a node is registered and not draining; its body says which
VERSION = "/version"  # the package's version (cluster.version.build_info); open, like the probes

# finish_reason values on the wire: "stop" (EOS or a stop token id), "length" (max_tokens or
# the context length), "abort" (cancelled through /internal/abort), "error" (see `error`).
FINISH_REASONS = frozenset({"stop", "length", "abort", "error"})

# 0: release 0.1.0, whose messages carry no version; 1: every message says its version.
# kv_transfer.version holds the same number for the KV handshake (a test keeps them equal).
PROTOCOL_VERSION = 1


def compatible(a: int, b: int) -> bool:
    """Whether processes of protocol versions `a` and `b` work together: at most one apart."""
    return abs(a - b) <= 1


class _Msg(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


def _name_the_field(value: Any, build: ValidatorFunctionWrapHandler) -> SamplingParams:
    """Build SamplingParams; a field it refuses becomes an error located at that field
    (`sampling.top_p`), not at the whole object."""
    try:
        return cast(SamplingParams, build(value))
    except ValidationError as exc:
        errors = exc.errors()
        cause = errors[0].get("ctx", {}).get("error") if len(errors) == 1 else None
        if not isinstance(cause, InvalidSampling):
            raise
        line = InitErrorDetails(
            type="value_error", loc=(cause.field,), input=value, ctx={"error": cause}
        )
        raise ValidationError.from_exception_data(exc.title, [line]) from None


# The sampling parameters as they cross the wire: models.sampling_params.SamplingParams itself,
# one JSON object with a key per field (tuples travel as lists and come back as tuples).
# SamplingParams validates its own bounds. `logprobs`: None = off, 0 = the sampled token only,
# n = also the top-n alternatives. `grammar`: llguidance grammar (JSON text) the output must
# match (response_format, forced tool calls).
WireSampling = Annotated[SamplingParams, WrapValidator(_name_the_field)]


class _Versioned(_Msg):
    """A message that says the protocol version of its writer (absent: version 0)."""

    protocol_version: int = Field(default=0, ge=0)


class _VersionedBody(_Versioned):
    """A request body the router sends a node: refused unless `compatible` with this one."""

    @field_validator("protocol_version")
    @classmethod
    def _compatible(cls, version: int) -> int:
        if not compatible(version, PROTOCOL_VERSION):
            raise ValueError(
                f"protocol version {version} is more than one version from this "
                f"process's {PROTOCOL_VERSION}"
            )
        return version


class TokenLogprobMsg(_Msg):
    """Log-probability of one sampled token; `top` holds (token_id, logprob) pairs, best first,
    when the request asked for alternatives. Mirrors engine.outputs.TokenLogprob."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = Field(default_factory=list)


class ErrorInfo(_Msg):
    """Why a node refused or failed a request. `code` is a short machine-readable word
    (e.g. "bad_request", "overloaded", "transfer_failed", "internal")."""

    code: str
    message: str
    param: str | None = None


class NodeErrorResponse(_Msg):
    """Body of every non-2xx answer of a node."""

    error: ErrorInfo


class AdapterRef(_Msg):
    """The LoRA adapter a request runs under: its name (the API's `model`), and the PEFT
    directory a node that does not have it yet loads it from."""

    name: str = Field(min_length=1)
    path: str = Field(min_length=1)


class LoadAdapterRequest(_Msg):
    """Router -> node: load (or unload: `lora_path` unused) a LoRA adapter (vLLM's body)."""

    lora_name: str = Field(min_length=1)
    lora_path: str = ""


class KVHandle(_Versioned):
    """Where a prefilled request's KV cache lives and for how long it is pinned.

    peer_info: opaque text from kv_transfer (base64 or JSON) that lets a decode node reach the
    prefill node's transfer agent. block_ids: the pinned blocks, in sequence order.
    num_tokens: tokens whose KV is in those blocks (the prompt length).
    lease_expires_at: unix time (seconds) after which the prefill node frees the blocks.
    """

    node_id: str
    peer_info: str
    block_ids: list[int]
    num_tokens: int = Field(ge=0)
    layout_fingerprint: str
    lease_expires_at: float
    lora_name: str | None = None  # the adapter the KV was computed under (None: the base)


class PrefillRequest(_VersionedBody):
    """Router -> prefill node: compute the prompt's KV, sample token 1, pin the blocks."""

    request_id: str
    prompt_token_ids: list[int] = Field(min_length=1)
    sampling: WireSampling
    priority: int = Field(default=0, ge=-PRIORITY_LIMIT, le=PRIORITY_LIMIT)  # lower first
    lora: AdapterRef | None = None


class PrefillResponse(_Msg):
    """Prefill node -> router. `finished` is true when the request ended at token 1 (EOS, a
    stop token, or max_tokens=1); then `kv` is None and no blocks are pinned. Otherwise `kv`
    holds the lease that the decode node (or `/internal/release`) ends."""

    request_id: str
    first_token_id: int
    first_logprob: TokenLogprobMsg | None = None
    finished: bool
    finish_reason: str | None = None
    num_prompt_tokens: int
    num_cached_tokens: int = 0
    kv: KVHandle | None = None


class EmbedRequest(_VersionedBody):
    """Router -> a node (of the prefill pool when there is one): the prompt's pooled hidden
    state, from a prefill-only pass that keeps no KV (engine.pooling). `dimensions`: the
    length the client asked for; a node refuses any but its hidden size."""

    request_id: str
    prompt_token_ids: list[int] = Field(min_length=1)
    pooling: Literal["last", "mean"] = "last"
    normalize: bool = True
    dimensions: int | None = Field(default=None, ge=1)


class EmbedResponse(_Msg):
    """Prefill node -> router: the pooled vector [hidden]."""

    request_id: str
    embedding: list[float]
    num_prompt_tokens: int


class ReleaseRequest(_VersionedBody):
    """Router -> prefill node: drop the lease of a request whose decode will not happen."""

    request_id: str


class AbortRequest(_VersionedBody):
    """Router -> decode node: stop generating for a request and free its blocks."""

    request_id: str


class ControlResponse(_Msg):
    """Answer to release and abort: `done` is false when the id was unknown or finished."""

    request_id: str
    done: bool


class DecodeRequest(_VersionedBody):
    """Router -> decode node: continue a request and stream its new tokens.

    output_token_ids: tokens already produced (after a remote prefill: [first_token]; when
    resuming after a node failure: every token so far; empty for a local prefill). They are
    never streamed again, and `sampling.max_tokens` counts them. kv: the prefill node's
    lease; None means the decode node computes the KV of prompt + output_token_ids itself.
    priority: lower is served first, in the node's queues and under preemption. wait_s: how
    long the node may queue the request for KV blocks before it answers 503 (the router
    sends what is left of the request's deadline, or of the lease less a slack if sooner);
    None: the node's own limit.
    """

    request_id: str
    prompt_token_ids: list[int] = Field(min_length=1)
    output_token_ids: list[int] = Field(default_factory=list)
    sampling: WireSampling
    kv: KVHandle | None = None
    priority: int = Field(default=0, ge=-PRIORITY_LIMIT, le=PRIORITY_LIMIT)
    wait_s: float | None = Field(default=None, gt=0)
    lora: AdapterRef | None = None  # must name the adapter `kv` was computed under


class TokenEvent(_Msg):
    """One line of the `/internal/generate` NDJSON stream: zero or more NEW tokens.

    `logprobs` is aligned with `token_ids` when the request asked for logprobs, else None.
    The last line has `finished=true` and a `finish_reason`. `num_cached_tokens` counts
    prompt tokens whose KV was not computed by this node (received or prefix-cached);
    `num_prefix_hit_tokens` those of them its own prefix cache held (for an import: the
    tokens it did not read).
    """

    token_ids: list[int] = Field(default_factory=list)
    logprobs: list[TokenLogprobMsg] | None = None
    finished: bool = False
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_prefix_hit_tokens: int = 0
    error: ErrorInfo | None = None
