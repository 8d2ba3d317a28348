"""bench.transfer's reported-bandwidth columns: the nodes' figure (bytes over the READ's
window) against the benchmark's (over the awaited call) and the memcpy's."""

from __future__ import annotations

from bench.transfer import _reported


def test_reported_bandwidth_is_compared_with_the_measured_and_the_memcpy() -> None:
    row = {"bytes": 1_000_000_000, "gbps": 4.0, "memcpy_gbps": 5.0}
    got = _reported(row, [0.26, 0.2, 0.24])  # median window 0.24 s: 4.167 GB/s
    assert got == {"reported_gbps": 4.167, "reported_to_measured": 1.042,
                   "reported_above_memcpy": False}  # fmt: skip
    assert _reported(row, [0.1])["reported_above_memcpy"] is True
