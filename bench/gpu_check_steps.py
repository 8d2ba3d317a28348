"""The steps of the prepared GPU check (bench.gpu_check): what each runs, its deadline, the
figures read from its JSON and the targets of the GPU issue they are held against.

The order: the acceptance figures first, the short kernel benchmarks before the engine runs
(the bf16 cache's kernels before the int8 one's, which is read against it; the offline run
before the CUDA graphs and the cluster, which find its kernels compiled), then the cluster,
and the tests last: the slowest step, which takes whatever the benchmarks leave of the budget.
The deadlines fit the default budget in sum (BUDGET_PLAN; tests/bench/test_gpu_check.py)."""

from __future__ import annotations

import platform
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Figures = dict[str, Any]
DEFAULT_BUDGET_S = 480.0  # one device call of at most 8 minutes, the check's whole run
STEP_SLACK_S = 10.0  # starting and reaping the steps' processes, in all
ROOT = Path(__file__).resolve().parents[1]  # the checkout: steps run there

# Test files whose behaviour changes on CUDA: the Triton kernels run compiled instead of
# interpreted (their shared cases pick the device), and the GPU-only tests run instead of
# skipping.
GPU_TEST_DIRS = ("tests/engine", "tests/kv_transfer", "tests/node")
GPU_TEST_MARKER = re.compile(r"\bcuda\b|TRITON_DEVICE|kernel_cases")


@dataclass(frozen=True)
class Step:
    """One child process of the check: ``python <argv(out_json)>`` within ``timeout_s``."""

    name: str
    args: tuple[str, ...]
    timeout_s: float
    figures_of: Callable[[Any, str, dict[str, Figures]], Figures]
    targets: dict[str, Callable[[Figures], bool]] = field(default_factory=dict)
    out_flag: str | None = "--out"  # how the step is told where to write its JSON
    min_s: float = 30.0  # not started with less of the budget left
    parses_output: bool = False  # figures come from the printed output, not a JSON
    takes_rest: bool = False  # runs until the budget ends: ``timeout_s`` is its least

    def argv(self, out_json: Path | None) -> list[str]:
        out = [self.out_flag, str(out_json or "OUT.json")] if self.out_flag else []
        return [*self.args, *out]

    def figures(self, result: Any, output: str, earlier: dict[str, Figures]) -> Figures:
        """Headline figures from the step's JSON or output (``earlier``: the steps before)."""
        try:
            return self.figures_of(result, output, earlier)
        except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as exc:
            return {"unreadable": f"{type(exc).__name__}: {exc}"}


def gpu_test_files(root: Path = ROOT) -> list[str]:
    """The test files that run differently on a GPU (sorted, relative to ``root``)."""
    found = []
    for folder in GPU_TEST_DIRS:
        for path in sorted((root / folder).rglob("test_*.py")):
            text = path.read_text(errors="replace")
            if GPU_TEST_MARKER.search(text):
                found.append(str(path.relative_to(root)))
    return found


def pytest_counts(_: Any, output: str, __: dict[str, Figures]) -> Figures:
    """passed / failed / skipped / errors from pytest's summary line."""
    counts = {k: 0 for k in ("passed", "failed", "skipped", "errors")}
    for number, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)\b", output):
        counts["errors" if word.startswith("error") else word] = int(number)
    failing = re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.M)
    return counts | ({"first_failures": failing[:5]} if failing else {})


def kernel_figures(result: Any, _: str, earlier: dict[str, Figures]) -> Figures:
    """Decode read / copy traffic and prefill FLOP/s; a quantized cache's decode ratio also
    over the bf16 cache's of the same run."""
    figures = {
        "decode_read_over_copy": result["ratio"],
        "decode_gbps": result["decode"]["gbps"],
        "prefill_tflops": result["prefill"]["tflops"],
        "prefill_over_matmul": result["prefill"]["ratio"],
    }
    bf16 = earlier.get("kernels", {}).get("decode_read_over_copy")
    if result["shape"].get("kv_cache_dtype", "auto") != "auto" and bf16:
        figures["decode_over_bf16_cache"] = result["ratio"] / bf16
    return figures


def prefill_figures(result: Any, _: str, __: dict[str, Figures]) -> Figures:
    return {"over_equal_matmul": result["ratio"]}


def gemm_figures(result: Any, _: str, __: dict[str, Figures]) -> Figures:
    """The worst speed-up over cuBLAS bf16 at 1-16 rows of the int4 product as the engine
    runs it (the decode kernel), of the tiled int4 kernel beside it and of fp8; the int4
    weight read against the same-run copy traffic."""
    decode = [c for c in result["cases"] if c["m"] <= 16]
    figures: Figures = {}
    for kind in ("w4a16", "w4a16_tiled", "fp8"):
        speedups = [c["bf16"]["time_ms"] / c[kind]["time_ms"] for c in decode if kind in c]
        if speedups:
            figures[f"{kind}_min_speedup_1_16_rows"] = min(speedups)
    reads = [c["w4a16"]["read_over_copy"] for c in decode if "w4a16" in c]
    figures["w4a16_min_read_over_copy"] = min(reads)
    return figures


def offline_figures(result: Any, _: str, __: dict[str, Figures]) -> Figures:
    step = result.get("decode_step") or {}
    return {
        "output_tok_s": result["results"]["splitserve"]["output_tok_s"],
        "decode_step_over_roofline": step.get("step_over_roofline"),
        "decode_batch": step.get("batch"),
    }


def graph_figures(result: Any, _: str, __: dict[str, Figures]) -> Figures:
    """Per batch: the decode step eager and replayed (ms), the replayed step over its
    roofline, the host's launch calls per step both ways, the rows whose bf16 greedy tokens
    the two share; the capture's seconds and memory against the KV plan's estimate."""
    figures: Figures = {}
    for batch, entry in result["batches"].items():
        eager, graphs = entry["eager"], entry["graphs"]
        figures[f"b{batch}_eager_ms"] = eager["median_step_s"] * 1e3
        figures[f"b{batch}_graphs_ms"] = graphs["median_step_s"] * 1e3
        figures[f"b{batch}_graphs_over_roofline"] = graphs["step_over_roofline"]
        figures[f"b{batch}_launch_calls_eager"] = eager["launches"]["host_calls"]
        figures[f"b{batch}_launch_calls_graphs"] = graphs["launches"]["host_calls"]
        figures[f"b{batch}_greedy_rows_same"] = entry["greedy"]["fraction"]
    start = result["start"]["graphs"]
    for name in ("capture_s", "graph_memory_gib", "graph_estimate_gib"):
        figures[name] = start.get(name)
    return figures


def cluster_figures(result: Any, _: str, __: dict[str, Figures]) -> Figures:
    """The saturated level's output rate and TTFT / TPOT p50 and p99 (bench.up_serve), the
    cluster's start-up, and the node calls refused for want of KV blocks."""
    return {
        **result["saturated"],
        "start_s": result["start_s"],
        "refused_for_kv": result["refused_for_kv"],
        "failed_requests": result["failed_requests"],
    }


def _graph_targets(batches: tuple[str, ...]) -> dict[str, Callable[[Figures], bool]]:
    """Each batch's replayed step within 1.5x its roofline and faster than eager; the KV
    plan kept at least what the graphs took."""

    def within(b: str) -> Callable[[Figures], bool]:
        return lambda f: bool(f[f"b{b}_graphs_over_roofline"] <= 1.5)

    def faster(b: str) -> Callable[[Figures], bool]:
        return lambda f: bool(f[f"b{b}_graphs_ms"] < f[f"b{b}_eager_ms"])

    targets = {f"b{b}<=1.5x_roofline": within(b) for b in batches}
    targets |= {f"b{b}_faster": faster(b) for b in batches}
    targets["estimate_covers_graphs"] = lambda f: f["graph_estimate_gib"] >= f["graph_memory_gib"]
    return targets


# one process on the one GPU: the project's `-n auto` (pytest-xdist, not carried) is dropped
PYTEST_ARGS = (
    "-m",
    "pytest",
    "-o",
    "addopts=",
    "-q",
    "-p",
    "no:cacheprovider",
    "--timeout",
    "120",
    "-rfE",
)
OFFLINE_ARGS = ("-m", "bench.offline", "--random-model", "llama-1b", "--device", "cuda")
OFFLINE_WORKLOAD = ("--dtype", "bfloat16", "--requests", "256")

UP_SERVE_ARGS = ("-m", "bench.up_serve", "--device", "cuda", "--random-model", "llama-1b")
UP_SERVE_LOAD = ("--concurrency", "16,64,256", "--waves", "2", "--max-output", "128")
UP_SERVE_BUDGET = ("--budget-s", "65")  # of the step's 80 s: the cluster's stop, the JSON

# The deadlines in the default budget, in seconds (each step's cut to what is left of it):
#   kernels 30 + kernels_int8 30 + prefill_attention 30 + weight_only_gemm 60
#   + offline_llama_1b 90 + cuda_graphs 75 + cluster 80 = 395 for the benchmarks,
#   + 10 slack for the processes between steps = 405; the tests get at least 480 - 405 = 75
#   and run on through what the benchmarks leave of the 480.
BENCHMARKS: list[Step] = [
    Step(
        "kernels",
        ("-m", "bench.kernels"),
        timeout_s=30,
        figures_of=kernel_figures,
        targets={"decode>=0.6": lambda f: f["decode_read_over_copy"] >= 0.6},
    ),
    Step(
        "kernels_int8",
        ("-m", "bench.kernels", "--kv-cache-dtype", "int8"),
        timeout_s=30,
        figures_of=kernel_figures,
        targets={">=0.6_of_bf16": lambda f: f.get("decode_over_bf16_cache", 0) >= 0.6},
    ),
    Step(
        "prefill_attention",
        ("-m", "bench.prefill_attention", "--seqs", "4", "--new", "2048"),
        timeout_s=30,
        figures_of=prefill_figures,
        targets={">=0.6": lambda f: f["over_equal_matmul"] >= 0.6},
    ),
    Step(
        "weight_only_gemm",
        ("-m", "bench.weight_only_gemm", "--rows", "1", "16", "2048"),
        timeout_s=60,
        figures_of=gemm_figures,
        targets={
            "int4>=1.5x": lambda f: f["w4a16_min_speedup_1_16_rows"] >= 1.5,
            "int4_read>=0.6_copy": lambda f: f["w4a16_min_read_over_copy"] >= 0.6,
        },
    ),
    Step(
        "offline_llama_1b",
        (*OFFLINE_ARGS, *OFFLINE_WORKLOAD),
        timeout_s=90,
        figures_of=offline_figures,
        targets={
            ">=20k_tok_s": lambda f: f["output_tok_s"] >= 20_000,
            "step<=1.5x_roofline": lambda f: (f["decode_step_over_roofline"] or 99) <= 1.5,
        },
    ),
    Step(
        "cuda_graphs",
        ("-m", "bench.cuda_graphs", "--random-model", "llama-1b", "--batches", "64", "256"),
        timeout_s=75,
        figures_of=graph_figures,
        targets=_graph_targets(("64", "256")),
    ),
    Step(
        "cluster",
        (*UP_SERVE_ARGS, *UP_SERVE_LOAD, *UP_SERVE_BUDGET),
        timeout_s=80,
        figures_of=cluster_figures,
        targets={
            "no_kv_refusals": lambda f: f["refused_for_kv"] == 0 and f["failed_requests"] == 0
        },
    ),
]
TESTS = Step(
    "tests",
    (*PYTEST_ARGS, *gpu_test_files()),
    timeout_s=DEFAULT_BUDGET_S - STEP_SLACK_S - sum(s.timeout_s for s in BENCHMARKS),
    figures_of=pytest_counts,
    targets={"no_failures": lambda f: f["failed"] == 0 and f["errors"] == 0},
    out_flag=None,
    parses_output=True,
    takes_rest=True,
)
STEPS: list[Step] = [*BENCHMARKS, TESTS]


def budget_plan(steps: list[Step]) -> float:
    """Seconds the steps' deadlines take together, with the slack between them: what the
    budget must hold for every step to get its whole deadline."""
    return sum(s.timeout_s for s in steps) + STEP_SLACK_S


def environment_summary() -> dict[str, Any]:
    """The machine the check ran on: GPU, driver-visible CUDA, torch and Triton."""
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    info["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1)}
        info["sm_count"] = props.multi_processor_count
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    return info
