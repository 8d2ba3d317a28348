"""What both node roles build: the engine thread, the KV transfer agent, the node's record.

A role's runtime (prefill_node.runtime, decode_node.runtime) is a NodeCore plus the role's
request handling. `NodeCore.open` resolves the model, starts the engine loop and, where the
role moves KV, the transfer agent; node.server registers the node and serves its probes.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Self
from urllib.parse import urlsplit

from cluster.node_records import NodeInfo, NodeLoad
from cluster.protocol import PROTOCOL_VERSION, EmbedRequest, EmbedResponse
from cluster.tracing import NO_TRACER, Tracer, make_tracer
from engine.config import EngineConfig, engine_config
from engine.kv.sizing import KVCapacity
from engine.loop.engine_loop import EngineLoop
from engine.phases import phase
from kv_transfer import KVTransferAgent, LeaseTable, TransferConfig
from models import resolve_model
from models.lora_modules import lora_module_map
from node.adapters import NodeAdapters
from node.kv_publisher import kv_events
from node.kv_shards import kv_shards, layout_text, model_layout, serve_rank_shards
from node.metrics import NodeMetrics
from node.pooling import embed
from node.settings import NodeSettings
from node.spans import kv_send_spans


class NodeCore:
    """A loaded node: its engine loop, its transfer agent (None on a colocated node) and the
    counters it reports. Subclasses add the role's requests and may override `_leases`
    (owner side: the agent serves lease releases) and `_moves_kv`."""

    def __init__(
        self, settings: NodeSettings, loop: EngineLoop, started_at: float, metrics: NodeMetrics
    ) -> None:
        self.settings = settings
        self.loop = loop
        self.metrics = metrics
        self.started_at = started_at
        self.agent: KVTransferAgent | None = None
        self.counts: Counter[str] = Counter()
        self._info: NodeInfo | None = None
        self.adapters = NodeAdapters(loop, loop.engine.config.enable_lora)
        self.tracer: Tracer = NO_TRACER  # set by open() when tracing is on

    @classmethod
    @asynccontextmanager
    async def open(cls, settings: NodeSettings, metrics: NodeMetrics) -> AsyncIterator[Self]:
        """Load the model, start the engine thread and the transfer agent; stop them after."""
        started_at = time.time()
        random = settings.engine.load_format == "random"  # weights of config.json's shapes
        model_dir = await asyncio.to_thread(
            resolve_model, settings.model, settings.model_cache, not random
        )
        config = await asyncio.to_thread(build_engine_config, settings, model_dir)
        loop = await EngineLoop.launch(config, settings.torch_threads)
        metrics.set_kv_capacity(loop.engine.runner.kv_capacity)
        node = cls(settings, loop, started_at, metrics)
        serving: asyncio.Task[None] | None = None
        try:
            service = "prefill" if settings.role == "prefill" else "decode"
            node.tracer = make_tracer(settings.trace_config(service, settings.resolved_node_id()))
            for name, path in lora_module_map(settings.lora_modules).items():
                await node.adapters.load(name, path)
            if node._moves_kv():
                with phase("transfer"):  # the KV cache registered with the transfer agent
                    node.agent = await asyncio.to_thread(node._make_agent)
                if node.tracer.enabled:
                    node.agent.transport.on_served(kv_send_spans(node.tracer, f"{service}.kv_send"))
                if node.agent.leases is not None:
                    serving = asyncio.create_task(node.agent.serve(), name="lease-serve")
            async with kv_events(settings, loop):
                yield node
        finally:
            if serving is not None:
                serving.cancel()
            if node.agent is not None:
                node.agent.close()
            node.tracer.shutdown()
            await asyncio.to_thread(loop.stop)

    def _moves_kv(self) -> bool:
        """Whether this node needs a transfer agent."""
        return True

    def _leases(self) -> LeaseTable | None:
        """The lease table of an owner (prefill) node; None on a reader."""
        return None

    def _make_agent(self) -> KVTransferAgent:
        engine = self.loop.engine
        agent = KVTransferAgent(
            engine.runner.kv_cache,
            fingerprint=model_layout(engine).fingerprint(),
            layout=layout_text(engine),
            config=transfer_config(self.settings),
            leases=self._leases(),
            shards=kv_shards(engine),
        )
        try:
            serve_rank_shards(engine, agent)
        except BaseException:
            agent.close()
            raise
        return agent

    async def embed(self, req: EmbedRequest) -> EmbedResponse:
        """A pooled vector (POST /internal/embed); no lease, no block kept."""
        return await embed(self.loop, self.metrics, self.counts, req)

    # ---- NodeRuntime (node.server) ---------------------------------------------------------

    @property
    def info(self) -> NodeInfo:
        if self._info is None:
            if self._moves_kv() and self.agent is None:
                raise RuntimeError("node info asked for before the transfer agent started")
            engine = self.loop.engine
            self._info = node_info(
                self.settings,
                layout_fingerprint=model_layout(engine).fingerprint(),
                layout=layout_text(engine),
                architecture=engine.model_config.architecture,
                weights=engine.runner.model.weight_bytes(),
                peer_info=self.agent.info.to_json() if self.agent is not None else "",
                max_model_len=engine.max_model_len,
                capacity=engine.runner.kv_capacity,
                started_at=self.started_at,
                import_fingerprints=self._import_fingerprints(),
                max_num_seqs=engine.config.max_num_seqs,
                max_queued=self._max_queued(),
            )
        return self._info

    def _import_fingerprints(self) -> list[str]:
        """The other KV layouts this node imports from, converting them (decode role)."""
        return []

    def _max_queued(self) -> int:
        """Requests this node lets wait for a place in its batch (decode role: KV imports)."""
        return 0

    @property
    def healthy(self) -> bool:
        return self.loop.running

    def engine_working(self, stalled_limit_s: float = 20.0) -> bool:
        """The engine loop runs and its current step (if any) began under `stalled_limit_s`
        ago: the streams' keepalives go out only while this holds, so a hung step goes
        silent and the router's idle timeout ends its streams."""
        return self.loop.stalled_for() < stalled_limit_s

    def on_fatal(self, callback: Callable[[str], None]) -> None:
        """A dead tensor-parallel rank is fatal (the engine loop stops on it first)."""
        ranks = self.loop.engine.ranks
        if ranks is not None:
            ranks.on_failure.append(callback)

    def load(self) -> NodeLoad:
        stats = self.loop.snapshot.stats
        leases = self._leases()
        return node_load(
            running=stats.running + stats.importing,
            waiting=stats.waiting,
            free_blocks=stats.free_blocks,
            total_blocks=stats.total_blocks,
            leases_held=leases.held().leases if leases is not None else 0,
        )

    def counters(self) -> dict[str, float]:
        out: dict[str, float] = dict(self.counts)
        engine_counters = asdict(self.loop.snapshot.counters)
        buckets = engine_counters.pop("spec_acceptance_buckets", ())
        tiers = engine_counters.pop("kv_tiers", {})
        out.update({f"kv_tier_{k}": v for k, v in tiers.items()})
        out.update(engine_counters)
        out.update({f"spec_acceptance_bucket_{i}": n for i, n in enumerate(buckets)})
        out["prefix_query_tokens"] = self.loop.snapshot.prefix_query_tokens
        out.update(self.loop.snapshot.lora or {})
        if self.agent is not None:
            out.update({f"transfer_{k}": v for k, v in asdict(self.agent.counters).items()})
        return out


def build_engine_config(settings: NodeSettings, model_dir: Path) -> EngineConfig:
    """The engine's config: the node's engine settings as given (the device fills in its
    defaults), its role, the draft model resolved like the model; adapters to load at start
    turn LoRA on."""
    given = settings.engine
    draft = given.draft_model
    if draft is not None:
        draft = resolve_model(str(draft), settings.model_cache)
    lora = given.enable_lora or bool(settings.lora_modules)
    given = given.replace(draft_model=draft, enable_lora=lora)
    return engine_config(model_dir, role=settings.role, **given.values)


def node_info(
    settings: NodeSettings,
    *,
    layout_fingerprint: str,
    layout: str = "",
    architecture: str = "",
    weights: tuple[int, int] = (0, 0),
    peer_info: str,
    max_model_len: int,
    capacity: KVCapacity,
    started_at: float,
    import_fingerprints: Sequence[str] = (),
    max_num_seqs: int = 0,
    max_queued: int = 0,
) -> NodeInfo:
    """What the node publishes in the registry."""
    return NodeInfo(
        node_id=settings.resolved_node_id(),
        role=settings.role,
        url=settings.url(),
        model=settings.model,
        layout_fingerprint=layout_fingerprint,
        layout=layout,
        architecture=architecture,
        weight_bytes=weights[0],
        expert_weight_bytes=weights[1],
        peer_info=peer_info,
        max_model_len=max_model_len,
        capacity=capacity.num_blocks,
        kv_capacity_tokens=capacity.num_tokens,
        kv_cache_bytes=capacity.num_bytes,
        started_at=started_at,
        import_fingerprints=list(import_fingerprints),
        max_num_seqs=max_num_seqs,
        max_queued=max_queued,
        protocol_version=PROTOCOL_VERSION,
    )


def node_load(
    *, running: int, waiting: int, free_blocks: int, total_blocks: int, leases_held: int = 0
) -> NodeLoad:
    usage = 1.0 - free_blocks / total_blocks if total_blocks else 0.0
    return NodeLoad(
        running=running,
        waiting=waiting,
        free_blocks=free_blocks,
        total_blocks=total_blocks,
        leases_held=leases_held,
        kv_usage=min(max(usage, 0.0), 1.0),
    )


def transfer_config(settings: NodeSettings) -> TransferConfig:
    """The node's transfer agent config: its transfer settings, and its id, address and token;
    peers dial the host of the node's URL."""
    token = settings.cluster_token
    return settings.transfer.build(
        node_name=settings.resolved_node_id(),
        tcp_host=settings.host,
        advertise_host=urlsplit(settings.url()).hostname,
        token=token.get_secret_value() if token is not None else None,
    )
