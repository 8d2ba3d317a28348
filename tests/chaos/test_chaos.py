"""Faults between hosts, in CI: a 2 + 2 cluster whose every process runs on a host of its own
(a network namespace), 60 requests per fault, each answer checked against the same request's
fault-free greedy answer, and the cluster audited once the fault heals (bench.chaos).

- a partition between a prefill host and a decode host while the prefill node holds a KV
  lease (every frame between them dropped for 10 s): the reads time out, the decode node
  computes the prompt itself;
- a decode host killed (SIGKILL to every process on it) while it streams: the router resumes
  each stream on the other decode node from the tokens so far.

Every request must end identical or with a clear retriable error (the partition: under 5%),
nothing may hang, and within 60 s no block, lease or process may be left over.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.chaos.client import Outcome
from bench.chaos.cluster import ChaosCluster, ClusterConfig
from bench.chaos.faults import FAULTS
from bench.chaos.netns import unavailable_reason
from bench.chaos.report import explain, table
from bench.chaos.run import RunConfig, baseline, failed_share_limit, run_fault, session
from bench.chaos.workload import Spec, make_specs

pytestmark = [pytest.mark.chaos, pytest.mark.model]

RUN = RunConfig(requests=60)
Prepared = tuple[ChaosCluster, list[Spec], list[Outcome]]


@pytest.fixture(scope="module")
def prepared(
    default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prepared]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"no hosts for the chaos tests: {reason}")
    config = ClusterConfig(default_model_dir, tmp_path_factory.mktemp("chaos"), transfer="nixl")
    specs = make_specs(RUN.requests, RUN.seed)
    with session(config) as cluster:
        yield cluster, specs, baseline(cluster, specs, RUN)


@pytest.mark.parametrize("name", ["partition", "decode-host-kill"])
def test_fault_loses_nothing(prepared: Prepared, name: str) -> None:
    cluster, specs, expected = prepared
    fault = FAULTS[name]
    row = run_fault(cluster, fault, specs, expected, RUN)
    report = f"\n{table([row])}\n{explain([row])}\nnotes: {row.notes}"
    # injected while requests ran, at the moment the fault names (a lease held, a stream on)
    assert row.injected_at_s is not None and row.injected_at_s < row.took_s, report
    assert not [n for n in row.notes if "did not fire" in n], report
    assert row.passes(failed_share_limit(fault)), report
