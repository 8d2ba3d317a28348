"""The GPU check's cluster step (bench.up_serve): the same command on the CPU, end to end, with
only the device and the sizes changed; and the refusals read from the router's real metrics."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from bench import gpu_check, up_serve
from bench.gpu_check_steps import STEPS, cluster_figures
from bench.up_child import UpChild
from router.metrics import RouterMetrics

# the GPU step's command, sized for a 2-core machine (later flags win)
CPU_SIZES = (
    "--random-model", "tiny", "--concurrency", "2,4", "--waves", "1", "--max-prompt", "64",
    "--max-output", "8", "--warmup", "1", "--budget-s", "240",
    "--up-args", "--threads-per-node 1 --num-kv-blocks 256",
)  # fmt: skip


def _cluster_step_on_cpu(default_model_dir: Path) -> Any:
    step = next(s for s in STEPS if s.name == "cluster")
    args = list(step.args)
    assert args[args.index("--device") + 1] == "cuda"
    args[args.index("--device") + 1] = "cpu"
    args += [*CPU_SIZES, "--tokenizer-from", str(default_model_dir)]
    return dataclasses.replace(step, args=tuple(args), timeout_s=300)


@pytest.mark.e2e
@pytest.mark.model
def test_the_cluster_step_runs_on_the_cpu(default_model_dir: Path, tmp_path: Path) -> None:
    step = _cluster_step_on_cpu(default_model_dir)
    (outcome,) = gpu_check.run_check([step], tmp_path, budget_s=300)
    assert outcome.status == "passed", outcome.tail
    assert outcome.checks == {"no_kv_refusals": True}
    figures = outcome.figures
    assert figures["concurrency"] == 4 and figures["output_tok_s"] > 0
    assert 0 < figures["ttft_p50_ms"] <= figures["ttft_p99_ms"]
    # a tiny model's few tokens can reach the client in one chunk under load: a TPOT of 0
    assert 0 <= figures["tpot_p50_ms"] <= figures["tpot_p99_ms"]
    result = outcome.result
    assert [level["summary"]["completed"] for level in result["levels"]] == [2, 4]
    assert set(result["kv"]["nodes"]) == {"prefill-0", "decode-0"}
    assert all(n["total_blocks"] == 256 for n in result["kv"]["nodes"].values())
    assert "| cluster | passed |" in (tmp_path / "gpu_check.md").read_text()


_SUMMARY = {
    "completed": 4, "failed": 0, "output_token_throughput": 100.0,
    "ttft_ms": {"p50": 10.0, "p99": 20.0}, "tpot_ms": {"p50": 1.0, "p99": 2.0},
}  # fmt: skip


class _Metrics:
    """What `refusals` reads of a running cluster: the router's real metrics, fixed stats."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self._text = generate_latest(metrics.registry).decode()

    def router_samples(self) -> Iterator[Sample]:
        for family in text_string_to_metric_families(self._text):
            yield from family.samples

    def node_urls(self, role: str) -> dict[str, str]:
        return {f"{role}-0": f"http://{role}"}

    def stats(self, url: str) -> dict[str, Any]:
        return {"counters": {"preemptions": 2.0}, "load": {"total_blocks": 64}}


def _refusals(metrics: RouterMetrics) -> dict[str, Any]:
    return up_serve.refusals(cast(UpChild, _Metrics(metrics)))


def test_busy_nodes_count_as_refused_and_fail_the_run() -> None:
    metrics = RouterMetrics()
    assert _refusals(metrics)["busy"] == {"prefill": 0, "decode": 0}
    metrics.node_errors.labels("decode", "busy").inc(3)
    metrics.node_errors.labels("decode", "unreachable").inc()
    metrics.node_errors.labels("prefill", "busy").inc()
    metrics.decode_waits.inc(5)
    kv = _refusals(metrics)
    assert kv["busy"] == {"prefill": 1, "decode": 3} and kv["decode_waits"] == 5
    assert kv["nodes"]["decode-0"] == {"preemptions": 2, "total_blocks": 64}
    summary = _SUMMARY
    args = up_serve.parse_args(["--device", "cpu"])
    result = up_serve.report(args, 5.0, [{"concurrency": 4, "summary": summary}], kv)
    assert result["refused_for_kv"] == 4 and not up_serve.served_all(result)
    figures = cluster_figures(result, "", {})
    assert figures["output_tok_s"] == 100.0 and figures["ttft_p99_ms"] == 20.0
    step = next(s for s in STEPS if s.name == "cluster")
    assert not step.targets["no_kv_refusals"](figures)
    kv["busy"] = {"prefill": 0, "decode": 0}
    served = up_serve.report(args, 5.0, [{"concurrency": 4, "summary": summary}], kv)
    assert up_serve.served_all(served)
    assert step.targets["no_kv_refusals"](cluster_figures(served, "", {}))
    failed = up_serve.report(
        args, 5.0, [{"concurrency": 4, "summary": summary | {"failed": 1}}], kv
    )
    assert not up_serve.served_all(failed)


def test_concurrency_levels_are_checked() -> None:
    assert up_serve.parse_levels("16,64,256") == (16, 64, 256)
    for bad in ("", "0,4", "64,16", "4,4", "a"):
        with pytest.raises(Exception, match="--concurrency"):
            up_serve.parse_levels(bad)


def test_a_missing_tokenizer_is_named(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"--tokenizer-from .*none"):
        up_serve.main(["--tokenizer-from", str(tmp_path / "none"), "--out", str(tmp_path / "o")])


def test_levels_past_the_budget_are_skipped() -> None:
    args = up_serve.parse_args(["--device", "cpu", "--concurrency", "2,4"])
    up = cast(UpChild, None)  # no level starts: nothing is sent
    levels = up_serve.run_levels(args, up, 512, deadline=time.monotonic() + 1)
    assert [level.get("skipped", "").endswith("s left") for level in levels] == [True, True]
    with pytest.raises(SystemExit, match="no concurrency level ran"):
        up_serve.report(args, 5.0, levels, _refusals(RouterMetrics()))
    ran = {"concurrency": 2, "summary": _SUMMARY}
    result = up_serve.report(args, 5.0, [ran, levels[1]], _refusals(RouterMetrics()))
    assert result["saturated"]["concurrency"] == 2 and up_serve.served_all(result)
