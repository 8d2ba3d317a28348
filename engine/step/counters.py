"""The engine's running totals (metrics, tests, benchmarks read them)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EngineCounters:
    """Monotonic totals since start, for metrics and tests."""

    steps: int = 0
    tokens_computed: int = 0  # every token run through the model (prefill chunks + decodes)
    generated_tokens: int = 0
    prefix_hit_tokens: int = 0
    preemptions: int = 0
    preemptions_swap: int = 0  # of preemptions, those swapped to the host KV tier
    preemptions_recompute: int = 0  # of preemptions, those to be recomputed
    finished_requests: int = 0
    constrained_requests: int = 0  # requests admitted with a grammar (engine.sampling.grammar)
    grammar_mask_seconds: float = 0.0  # time computing token masks (worker thread)
    grammar_mask_steps: int = 0  # steps that computed masks
    # speculative decoding (engine.speculative.metrics): guesses verified, accepted, tokens
    # emitted by speculative chunks, chunks verified, and the acceptance-rate histogram
    spec_proposed: int = 0
    spec_accepted: int = 0
    spec_emitted: int = 0
    spec_chunks: int = 0
    spec_acceptance_sum: float = 0.0
    spec_acceptance_buckets: tuple[int, ...] = ()
    # a hybrid model's state checkpoints (engine.kv.state_checkpoints): published, started
    # from (prefix-cache hits), dropped for room
    state_checkpoint_saves: int = 0
    state_checkpoint_hits: int = 0
    state_checkpoint_evictions: int = 0
    # KV tiers below the device (engine.kv.offload.KVTiers.stats): flat numbers per tier,
    # replaced (never changed in place) after every step; empty without tiers
    kv_tiers: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineStats:
    running: int
    waiting: int
    pinned: int
    importing: int
    free_blocks: int
    total_blocks: int
    free_state_slots: int = 0  # of a hybrid model's linear-attention state pool
    total_state_slots: int = 0
    swapped_states: int = 0  # preempted requests' states held in the host swap space
    state_checkpoints: int = 0  # checkpoint slots holding a state (or about to)

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.total_blocks if self.total_blocks else 0.0
