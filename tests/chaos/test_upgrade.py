"""A rolling upgrade under load: release v0.1.0's router and nodes (a git worktree of the tag,
protocol version 0) in one cluster of network namespaces, the router then each node drained
and started on this tree in turn while requests stream (bench.chaos.upgrade). Nothing may be
lost; every answer is identical to the fault-free one, or failed clearly (a refused
connection while the router restarts too) and its retry is.

It takes minutes, so it runs only when asked for: `pytest tests/chaos -m upgrade`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos.cluster import ClusterConfig
from bench.chaos.netns import unavailable_reason
from bench.chaos.report import explain, table
from bench.chaos.run import RunConfig, baseline, session
from bench.chaos.upgrade import OLD_TAG, release_tree, run_upgrade
from bench.chaos.upgrade import unavailable_reason as no_release
from bench.chaos.workload import make_specs
from cluster.protocol import PROTOCOL_VERSION

# the cluster, the fault-free run, every process onto v0.1.0 and five restarts, each new
# process importing torch: over 10 minutes on 2 cores shared with other work
pytestmark = [pytest.mark.upgrade, pytest.mark.model, pytest.mark.timeout(1200)]

RUN = RunConfig(requests=40)


def test_a_rolling_upgrade_from_the_first_release_loses_nothing(
    default_model_dir: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if "upgrade" not in (request.config.getoption("-m") or ""):
        pytest.skip("a rolling upgrade takes minutes: run it with -m upgrade")
    reason = unavailable_reason() or no_release()
    if reason is not None:
        pytest.skip(f"no rolling upgrade here: {reason}")
    config = ClusterConfig(default_model_dir, tmp_path / "cluster", transfer="nixl")
    specs = make_specs(RUN.requests, RUN.seed)
    with session(config) as cluster, release_tree() as old_tree:
        expected = baseline(cluster, specs, RUN)
        row = run_upgrade(cluster, specs, expected, RUN, old_tree)
    report = f"\n{table([row])}\n{explain([row])}\nnotes: {row.notes}"
    versions = [n.split("=", 1)[1].split(":")[0] for n in row.notes if "protocol_version=" in n]
    assert versions == ["0"] * 4 + [str(PROTOCOL_VERSION)] * 4, report  # v0.1.0, then this
    routers = [n.split(":")[0] for n in row.notes if n.startswith("router from")]
    assert routers == [f"router from {OLD_TAG}", "router from this tree"], report
    assert row.passes(None), report  # clear failures were retried: problems otherwise
    assert row.requests > RUN.requests, report  # the requests ran through the whole roll
    assert OLD_TAG in row.what
