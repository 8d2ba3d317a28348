"""Counters of speculative decoding: guesses proposed, accepted, tokens emitted."""

from __future__ import annotations

from dataclasses import dataclass, field

# upper bounds of the acceptance-rate histogram's buckets (accepted / proposed per chunk)
ACCEPTANCE_BUCKETS = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass
class SpeculativeStats:
    """Monotonic totals since start; `acceptance` counts verified chunks per bucket of
    ACCEPTANCE_BUCKETS (cumulative, like a Prometheus histogram's buckets)."""

    proposed: int = 0  # guesses verified
    accepted: int = 0  # of those, accepted by verification
    emitted: int = 0  # tokens appended by speculative chunks (accepted ones + one each)
    chunks: int = 0  # speculative chunks verified
    acceptance: list[int] = field(default_factory=lambda: [0] * len(ACCEPTANCE_BUCKETS))
    acceptance_sum: float = 0.0

    def record(self, proposed: int, accepted: int, emitted: int) -> None:
        self.proposed += proposed
        self.accepted += accepted
        self.emitted += emitted
        self.chunks += 1
        rate = accepted / proposed if proposed else 0.0
        self.acceptance_sum += rate
        for i, bound in enumerate(ACCEPTANCE_BUCKETS):
            if rate <= bound:
                self.acceptance[i] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted over proposed guesses (0 before any)."""
        return self.accepted / self.proposed if self.proposed else 0.0

    def copy(self) -> SpeculativeStats:
        return SpeculativeStats(
            self.proposed,
            self.accepted,
            self.emitted,
            self.chunks,
            list(self.acceptance),
            self.acceptance_sum,
        )
