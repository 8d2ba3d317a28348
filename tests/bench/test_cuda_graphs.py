"""bench.cuda_graphs on the CPU: the loop that admits, decodes, counts and times a batch runs
through the real engine (both modes eager here, so their tokens agree), its report reads
into the GPU check's figures and targets, and without CUDA the benchmark says so."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from bench import cuda_graphs
from bench.common import ModelShape
from bench.gpu_check_steps import STEPS, graph_figures
from bench.random_model import write_random_model_dir


def test_batches_run_in_both_modes_and_read_into_the_check(tmp_path: Path) -> None:
    model_dir = write_random_model_dir("tiny", tmp_path / "tiny")
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 512) for _ in range(12)] for _ in range(4)]
    runs = {
        mode: cuda_graphs.run_mode(model_dir, prompts, [2, 4], 2, eager, device="cpu")
        for mode, eager in cuda_graphs.MODES.items()
    }
    assert runs["eager"][1]["kv_blocks"] > 0 and "capture_s" not in runs["graphs"][1]
    shape = ModelShape.from_dir(model_dir)
    report: dict[str, Any] = {"start": {"graphs": runs["graphs"][1]}, "batches": {}}
    for batch in (2, 4):
        results = {mode: runs[mode][0][batch] for mode in cuda_graphs.MODES}
        assert all(len(t) >= 2 for t in results["graphs"]["tokens"])
        entry = cuda_graphs.batch_entry(results, shape, traffic_gbps=10.0, peak=100.0)
        assert entry["greedy"] == {"rows": batch, "same_rows": batch, "fraction": 1.0}
        assert entry["graphs"]["step_over_roofline"] > 0 and entry["speedup"] > 0
        report["batches"][str(batch)] = entry
    figures = graph_figures(report, "", {})
    assert figures["b4_greedy_rows_same"] == 1.0 and figures["capture_s"] is None
    step = next(s for s in STEPS if s.name == "cuda_graphs")
    assert "--batches" in step.argv(None)


def test_the_check_holds_the_graphs_to_their_targets() -> None:
    step = next(s for s in STEPS if s.name == "cuda_graphs")
    figures = {
        "b64_graphs_over_roofline": 1.2, "b64_graphs_ms": 3.0, "b64_eager_ms": 9.0,
        "b256_graphs_over_roofline": 1.7, "b256_graphs_ms": 6.0, "b256_eager_ms": 5.0,
        "graph_estimate_gib": 0.5, "graph_memory_gib": 0.4,
    }  # fmt: skip
    checks = {name: check(figures) for name, check in step.targets.items()}
    assert checks == {
        "b64<=1.5x_roofline": True, "b256<=1.5x_roofline": False, "b64_faster": True,
        "b256_faster": False, "estimate_covers_graphs": True,
    }  # fmt: skip


def test_without_cuda_the_benchmark_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("on a GPU it runs for real")
    assert cuda_graphs.main(["--out", "unused.json"]) == 2
    assert "no CUDA device" in capsys.readouterr().out
