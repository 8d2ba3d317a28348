"""The KV tier flags reach the engine config, bad combinations exit 2 before any model loads,
and /metrics shows each tier's numbers, preemptions by kind and dropped disk files."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from node.cli import settings_from_args
from node.core import build_engine_config
from node.metrics import NodeMetrics
from tests.node.node_args import parse_decode_args, refusal


def test_tier_flags_reach_the_engine_config(tmp_path: Path) -> None:
    args = parse_decode_args(
        "--kv-offload-cpu-gb", "2", "--kv-offload-disk-path", str(tmp_path / "kv"),
        "--kv-offload-disk-gb", "10",
    )  # fmt: skip
    config = build_engine_config(settings_from_args(args, "decode"), tmp_path)
    assert config.kv_offload_cpu_gb == 2.0 and config.kv_offload_disk_gb == 10.0
    assert config.kv_offload_disk_path == tmp_path / "kv"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--kv-offload-disk-path", "/kv", "--kv-offload-disk-gb", "1"), "needs kv_offload_cpu"),
        (("--kv-offload-cpu-gb", "1", "--kv-offload-disk-path", "/kv"), "go together"),
        (("--kv-offload-cpu-gb", "0"), "--kv-offload-cpu-gb: must be > 0"),
    ],
)
def test_bad_tier_settings_exit_2(
    argv: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in refusal(argv, capsys)


def test_metrics_show_every_tier_preemptions_by_kind_and_dropped_files() -> None:
    metrics = NodeMetrics("decode", "d0")
    counters = {
        "kv_tier_host_capacity_blocks": 64, "kv_tier_host_used_blocks": 10,
        "kv_tier_host_hits": 7, "kv_tier_host_bytes_out": 7 * 2048,
        "kv_tier_disk_capacity_blocks": 128, "kv_tier_disk_loads": 3,
        "kv_tier_disk_files_dropped_checksum": 2, "preemptions_swap": 4,
        "preemptions_recompute": 1,
    }  # fmt: skip
    metrics.watch(lambda: counters)
    body, _ = metrics.render()
    samples = {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("role", "node")))): (
            s.value
        )
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }
    assert samples[("splitserve_kv_tier_capacity_blocks", (("tier", "host"),))] == 64
    assert samples[("splitserve_kv_tier_used_blocks", (("tier", "host"),))] == 10
    assert samples[("splitserve_kv_tier_hits_total", (("tier", "host"),))] == 7
    assert samples[("splitserve_kv_tier_loads_total", (("tier", "disk"),))] == 3
    key = ("splitserve_kv_tier_bytes_total", (("direction", "out"), ("tier", "host")))
    assert samples[key] == 7 * 2048
    assert samples[("splitserve_preemptions_by_kind_total", (("kind", "swap"),))] == 4
    assert samples[("splitserve_preemptions_by_kind_total", (("kind", "recompute"),))] == 1
    reason = (("reason", "checksum"),)
    assert samples[("splitserve_kv_disk_files_dropped_total", reason)] == 2
