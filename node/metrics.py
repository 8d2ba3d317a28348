"""Prometheus metrics of a prefill, decode or colocated node (GET /metrics).

Each app has its own registry, so several nodes can live in one process (tests). Every
series carries the labels `role` and `node`. Three sources feed it:
- gauges, set from the node's load when scraped (`observe`);
- counters of engine and runtime totals (`watch`): read from `NodeRuntime.counters()` at
  scrape time, so they are exactly the engine's numbers and never counted twice;
- histograms and event counters that the runtime updates as requests go (on the event loop).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from cluster.node_records import NodeLoad
from engine.kv.sizing import KVCapacity
from engine.speculative.metrics import ACCEPTANCE_BUCKETS

_LABELS = ("role", "node")
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip
TRANSFER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
WINDOW_BUCKETS = (0.0001, 0.00025, 0.0005, *TRANSFER_BUCKETS)
GBPS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0)
SIZE_BUCKETS = tuple(float(4**k * 1024) for k in range(1, 11))  # 4 KiB .. 1 GiB
TRANSFER_FAILURE_KINDS = ("timeout", "peer", "layout", "refused", "other")

# metric name (without _total) -> (key in NodeRuntime.counters(), help text)
TOTALS: dict[str, tuple[str, str]] = {
    "splitserve_requests": ("requests_total", "Requests received by the node"),
    "splitserve_generation_tokens": ("generated_tokens", "Tokens sampled by the engine"),
    "splitserve_prefix_cache_hit_tokens": (
        "prefix_hit_tokens",
        "Prompt tokens found in the prefix cache at admission",
    ),
    "splitserve_prefix_cache_query_tokens": (
        "prefix_query_tokens",
        "Tokens looked up in the prefix cache at admission",
    ),
    "splitserve_preemptions": ("preemptions", "Requests preempted for lack of KV blocks"),
    "splitserve_state_checkpoint_saves": (
        "state_checkpoint_saves",
        "Hybrid models: linear-attention state checkpoints saved at block boundaries",
    ),
    "splitserve_state_checkpoint_hits": (
        "state_checkpoint_hits",
        "Hybrid models: prefills resumed from a state checkpoint (a prefix-cache hit)",
    ),
    "splitserve_state_checkpoint_evictions": (
        "state_checkpoint_evictions",
        "Hybrid models: state checkpoints dropped for room",
    ),
    "splitserve_constrained_requests": (
        "constrained_requests",
        "Requests admitted with a grammar (structured output or a forced tool call)",
    ),
    "splitserve_grammar_mask_seconds": (
        "grammar_mask_seconds",
        "Time spent computing grammar token masks (divide by grammar_mask_steps: per step)",
    ),
    "splitserve_grammar_mask_steps": ("grammar_mask_steps", "Steps that computed grammar masks"),
    "splitserve_spec_proposed_tokens": (
        "spec_proposed",
        "Speculative decoding: guessed tokens verified",
    ),
    "splitserve_spec_accepted_tokens": (
        "spec_accepted",
        "Speculative decoding: guessed tokens accepted",
    ),
    "splitserve_spec_emitted_tokens": (
        "spec_emitted",
        "Speculative decoding: tokens emitted by verified chunks (accepted guesses + one each)",
    ),
    "splitserve_kv_recomputes": (
        "recomputes_total",
        "Prompts recomputed locally after a failed KV transfer",
    ),
}


class _Totals(Collector):
    """Counters read from a `counters()` callable at scrape time."""

    def __init__(self, labels: tuple[str, str]) -> None:
        self._labels = list(labels)
        self.source: Callable[[], Mapping[str, float]] | None = None
        self._last: Mapping[str, float] = {}

    def follow(self, source: Callable[[], Mapping[str, float]] | None) -> None:
        if source is None and self.source is not None:
            self._last = dict(self.source())  # the final values outlive the runtime
        self.source = source

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
        if self.source is not None:
            self._last = dict(self.source())
        for name, (key, doc) in TOTALS.items():
            family = CounterMetricFamily(name, doc, labels=_LABELS)
            family.add_metric(self._labels, float(self._last.get(key, 0)))
            yield family
        yield self._acceptance()
        yield from kv_tier_families(self._labels, self._last)
        yield from lora_families(self._labels, self._last)

    def _acceptance(self) -> HistogramMetricFamily:
        """Acceptance rate (accepted / guessed) of each verified speculative chunk."""
        last = self._last
        family = HistogramMetricFamily(
            "splitserve_spec_acceptance_rate",
            "Speculative decoding: accepted over guessed tokens per verified chunk",
            labels=_LABELS,
        )
        buckets = [
            (str(bound), float(last.get(f"spec_acceptance_bucket_{i}", 0)))
            for i, bound in enumerate(ACCEPTANCE_BUCKETS)
        ]
        buckets.append(("+Inf", float(last.get("spec_chunks", 0))))
        family.add_metric(self._labels, buckets, float(last.get("spec_acceptance_sum", 0.0)))
        return family


# metric name -> (key after kv_tier_<tier>_, help); counters end in _total, gauges do not
_TIER_SERIES: dict[str, tuple[str, str]] = {
    "splitserve_kv_tier_capacity_blocks": ("capacity_blocks", "KV blocks a lower tier holds"),
    "splitserve_kv_tier_used_blocks": ("used_blocks", "KV blocks held in a lower tier"),
    "splitserve_kv_tier_hits": ("hits", "Prefix blocks found in a lower tier"),
    "splitserve_kv_tier_loads": ("loads", "Blocks copied from a lower tier to the device"),
    "splitserve_kv_tier_stores": ("stores", "Blocks written into a lower tier"),
    "splitserve_kv_tier_evictions": ("evictions", "Blocks evicted from a lower tier for room"),
    "splitserve_kv_tier_dropped": (
        "dropped",
        "Writes to a lower tier skipped: its copies were too far behind, or the shutdown's "
        "deadline passed",
    ),
}


def kv_tier_families(
    labels: list[str], last: Mapping[str, float]
) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    """Per tier (host, disk): capacity, usage, hits, loads, stores, evictions, drops, bytes;
    preemptions by kind (swap, recompute); bad disk files dropped at start, by reason."""
    tiers = [t for t in ("host", "disk") if f"kv_tier_{t}_capacity_blocks" in last]
    for name, (key, doc) in _TIER_SERIES.items():
        gauge = key.endswith("_blocks")
        kind = GaugeMetricFamily if gauge else CounterMetricFamily
        family = kind(name, doc, labels=[*_LABELS, "tier"])
        for tier in tiers:
            family.add_metric([*labels, tier], float(last.get(f"kv_tier_{tier}_{key}", 0)))
        yield family
    moved = CounterMetricFamily(
        "splitserve_kv_tier_bytes", "Bytes copied into (in) and out of a lower tier",
        labels=[*_LABELS, "tier", "direction"],
    )  # fmt: skip
    for tier in tiers:
        for way in ("in", "out"):
            moved.add_metric(
                [*labels, tier, way], float(last.get(f"kv_tier_{tier}_bytes_{way}", 0))
            )
    yield moved
    kinds = CounterMetricFamily(
        "splitserve_preemptions_by_kind", "Preemptions, swapped out or to be recomputed",
        labels=[*_LABELS, "kind"],
    )  # fmt: skip
    for kind_name in ("swap", "recompute"):
        kinds.add_metric([*labels, kind_name], float(last.get(f"preemptions_{kind_name}", 0)))
    yield kinds
    files = CounterMetricFamily(
        "splitserve_kv_disk_files_dropped", "Bad KV block files dropped at start, by reason",
        labels=[*_LABELS, "reason"],
    )  # fmt: skip
    prefix = "kv_tier_disk_files_dropped_"
    for key, value in last.items():
        if key.startswith(prefix):
            files.add_metric([*labels, key.removeprefix(prefix)], float(value))
    yield files


_LORA_TOTALS = {
    "splitserve_lora_loads": ("lora_loads", "LoRA adapters read from disk"),
    "splitserve_lora_slot_loads": ("lora_slot_loads", "LoRA adapters copied into a slot"),
    "splitserve_lora_slot_evictions": (
        "lora_slot_evictions",
        "LoRA adapters evicted from a device slot for another",
    ),
    "splitserve_lora_host_evictions": (
        "lora_host_evictions",
        "LoRA adapters dropped from the host-memory cache",
    ),
}


def lora_families(labels: list[str], last: Mapping[str, float]) -> Iterator[CounterMetricFamily]:
    """Adapter loads and evictions; requests and computed tokens by adapter."""
    for name, (key, doc) in _LORA_TOTALS.items():
        family = CounterMetricFamily(name, doc, labels=_LABELS)
        family.add_metric(labels, float(last.get(key, 0)))
        yield family
    for what, doc in (("requests", "Requests"), ("tokens", "Tokens computed")):
        family = CounterMetricFamily(
            f"splitserve_lora_{what}", f"{doc} under a LoRA adapter", labels=[*_LABELS, "adapter"]
        )
        for key, value in last.items():
            if key.startswith(f"lora_{what}:"):
                family.add_metric([*labels, key.split(":", 1)[1]], float(value))
        yield family


class NodeMetrics:
    """The node's metrics, labelled with its role and id."""

    def __init__(self, role: str, node_id: str) -> None:
        self.registry = CollectorRegistry()
        self._labels = (role, node_id)
        self.running = self._gauge("splitserve_running_requests", "Requests being computed")
        self.waiting = self._gauge("splitserve_waiting_requests", "Requests queued for a slot")
        self.kv_usage = self._gauge(
            "splitserve_kv_usage_ratio", "Share of KV blocks held by requests (0..1)"
        )
        self.leases = self._gauge("splitserve_kv_leases", "KV leases held for decode nodes")
        self.kv_blocks = self._gauge("splitserve_kv_capacity_blocks", "KV blocks allocated")
        self.kv_tokens = self._gauge("splitserve_kv_capacity_tokens", "Tokens the KV cache holds")
        self.kv_bytes = self._gauge("splitserve_kv_cache_bytes", "Bytes of the KV cache")
        self.queue_time = self._histogram(
            "splitserve_queue_time_seconds",
            "From arrival at the node to the request's first scheduled engine step",
        )
        self.ttft = self._histogram(
            "splitserve_ttft_seconds", "From arrival at the node to its first token out"
        )
        self.e2e = self._histogram(
            "splitserve_e2e_seconds", "From arrival at the node to the end of its stream (decode)"
        )
        self.prompt_tokens = self._counter(
            "splitserve_prompt_tokens", "Prompt tokens of the requests the node accepted"
        )
        self.transfer_seconds = self._histogram(
            "splitserve_kv_transfer_seconds",
            "Duration of KV transfers (READs) that completed",
            TRANSFER_BUCKETS,
        )
        self.transfer_bytes = self._counter(
            "splitserve_kv_transfer_bytes", "Bytes of KV moved by completed transfers"
        )
        self._failures = Counter(
            "splitserve_kv_transfer_failures",
            "Failed KV transfers, by kind (timeout, peer, layout, refused, other)",
            [*_LABELS, "kind"],
            registry=self.registry,
        )
        for kind in TRANSFER_FAILURE_KINDS:  # every kind shows, at 0 until it happens
            self._failures.labels(*self._labels, kind)
        pair = [*_LABELS, "transport", "peer"]  # peer: the node read from
        self._window = Histogram(
            "splitserve_kv_transfer_window_seconds",
            "KV READs that completed: the decode node's wait, less connection set-up",
            pair, buckets=WINDOW_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self._gbps = Histogram(
            "splitserve_kv_transfer_bandwidth_gbps",
            "KV READs that completed: bytes / window, in GB/s",
            pair, buckets=GBPS_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self._size = Histogram(
            "splitserve_kv_transfer_size_bytes", "Bytes moved by one KV READ",
            pair, buckets=SIZE_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self._recomputes = Counter(
            "splitserve_kv_recomputes_by_cause",
            "Prompts recomputed after a failed KV transfer, by the failure's kind",
            [*_LABELS, "cause"], registry=self.registry,
        )  # fmt: skip
        for kind in TRANSFER_FAILURE_KINDS:
            self._recomputes.labels(*self._labels, kind)
        self._totals = _Totals(self._labels)
        self.registry.register(self._totals)

    def _gauge(self, name: str, doc: str) -> Gauge:
        return Gauge(name, doc, _LABELS, registry=self.registry).labels(*self._labels)

    def _counter(self, name: str, doc: str) -> Counter:
        return Counter(name, doc, _LABELS, registry=self.registry).labels(*self._labels)

    def _histogram(
        self, name: str, doc: str, buckets: tuple[float, ...] = LATENCY_BUCKETS
    ) -> Histogram:
        family = Histogram(name, doc, _LABELS, buckets=buckets, registry=self.registry)
        return family.labels(*self._labels)

    def transfer_failed(self, kind: str) -> None:
        """Count one failed transfer; `kind` is one of TRANSFER_FAILURE_KINDS."""
        if kind not in TRANSFER_FAILURE_KINDS:
            raise ValueError(f"kind must be one of {TRANSFER_FAILURE_KINDS}, got {kind!r}")
        self._failures.labels(*self._labels, kind).inc()

    def transfer_done(self, transport: str, peer: str, nbytes: int, window_s: float) -> None:
        """A completed READ from `peer` over `transport`: its window, bandwidth and size."""
        labels = (*self._labels, transport, peer)
        self._size.labels(*labels).observe(nbytes)
        if window_s > 0 and nbytes > 0:
            self._window.labels(*labels).observe(window_s)
            self._gbps.labels(*labels).observe(nbytes / window_s / 1e9)

    def recomputed(self, cause: str) -> None:
        """A prompt recomputed after a failed transfer of kind `cause`."""
        if cause not in TRANSFER_FAILURE_KINDS:
            raise ValueError(f"cause must be one of {TRANSFER_FAILURE_KINDS}, got {cause!r}")
        self._recomputes.labels(*self._labels, cause).inc()

    def watch(self, counters: Callable[[], Mapping[str, float]] | None) -> None:
        """Read the totals from `counters()` at each scrape (None: keep the last values)."""
        self._totals.follow(counters)

    def set_kv_capacity(self, capacity: KVCapacity) -> None:
        """The KV cache's size, once it is allocated."""
        self.kv_blocks.set(capacity.num_blocks)
        self.kv_tokens.set(capacity.num_tokens)
        self.kv_bytes.set(capacity.num_bytes)

    def observe(self, load: NodeLoad) -> None:
        self.running.set(load.running)
        self.waiting.set(load.waiting)
        self.kv_usage.set(load.kv_usage)
        self.leases.set(load.leases_held)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
