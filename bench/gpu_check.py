"""The prepared GPU check: the GPU tests and every GPU benchmark in one command, one JSON.

    python -m bench.gpu_check [--out DIR] [--budget-s 480] [--only NAME,...] [--list]
    splitserve bench gpu ...

A session lent a GPU runs this first (one device call), then fixes what it shows and runs it
again. Each step is a child process with its own deadline, cut to what is left of the
budget, so one crash or hang (a kernel taking its pytest worker down) costs that step only;
the tests, last, run on through what the others leave, and steps the budget cannot reach
are recorded as skipped. The default steps' deadlines fit the default budget in sum
(bench.gpu_check_steps). The output folder gets three files, within what a device call
brings back: ``gpu_check.json`` (every step's status, seconds,
headline figures against the targets of the GPU issue, the benchmarks' own JSON and the tail
of each log), ``gpu_check.md`` (the table) and ``gpu_check.log`` (every step's output).

Wheels the device machine lacks come from ``python -m bench.device_wheels`` (docs/gpu.md,
The GPU check). Without CUDA the check says so and exits 2; ``--list`` prints the plan anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu_check_steps import (
    DEFAULT_BUDGET_S,
    ROOT,
    STEPS,
    Figures,
    Step,
    budget_plan,
    environment_summary,
)

FILES = ("gpu_check.json", "gpu_check.md", "gpu_check.log")


@dataclass
class Outcome:
    """What one step did: ``status`` is passed, failed, timeout, skipped or error."""

    name: str
    status: str
    seconds: float = 0.0
    returncode: int | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)
    result: Any = None  # the step's own JSON
    tail: str = ""


def run_step(
    step: Step, work: Path, timeout_s: float, log: Any, earlier: dict[str, Figures]
) -> Outcome:
    """Run ``step`` as a child process in the checkout (its JSON into ``work``) within
    ``timeout_s``; ``earlier``: the figures of the steps before it."""
    out_json = work / f"{step.name}.json"
    argv = [sys.executable, *step.argv(out_json)]
    log.write(f"\n===== {step.name}: {' '.join(argv[1:])} (deadline {timeout_s:.0f} s)\n")
    log.flush()
    started = time.monotonic()
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=step_env(),
            cwd=ROOT,
            check=False,
        )
        output, code, status = done.stdout + done.stderr, done.returncode, ""
    except subprocess.TimeoutExpired as exc:
        output, code, status = _text(exc.stdout) + _text(exc.stderr), None, "timeout"
    seconds = time.monotonic() - started
    log.write(output)
    log.flush()
    result = _read_json(out_json)
    readable = result is not None or step.parses_output
    figures = step.figures(result, output, earlier) if readable else {}
    checks = {name: _holds(check, figures) for name, check in step.targets.items() if figures}
    if not status:
        status = "passed" if code == 0 else "failed"
    tail = output[-4000:]
    return Outcome(step.name, status, round(seconds, 1), code, figures, checks, result, tail)


def _holds(check: Callable[[Figures], bool], figures: Figures) -> bool:
    try:
        return bool(check(figures))
    except (KeyError, TypeError):
        return False


def step_env() -> dict[str, str]:
    """The children's environment: unbuffered, the interpreter off (they run on the GPU)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_check(
    steps: list[Step],
    out_dir: Path,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> list[Outcome]:
    """Every step in order within ``budget_s`` in all; writes the three files to ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    deadline = clock() + budget_s
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory() as tmp, open(out_dir / FILES[2], "w") as log:
        for step in steps:
            left = deadline - clock()
            if left < step.min_s:
                outcomes.append(Outcome(step.name, "skipped", tail=f"{left:.0f} s left"))
                continue
            try:
                earlier = {o.name: o.figures for o in outcomes}
                timeout_s = left if step.takes_rest else min(step.timeout_s, left)
                outcome = run_step(step, Path(tmp), timeout_s, log, earlier)
            except Exception as exc:  # a step's own bug must not end the check
                outcome = Outcome(step.name, "error", tail=f"{type(exc).__name__}: {exc}")
            outcomes.append(outcome)
            print(table_row(outcome), flush=True)
    write_report(outcomes, out_dir, budget_s)
    return outcomes


def write_report(outcomes: list[Outcome], out_dir: Path, budget_s: float) -> None:
    report = {
        "environment": environment_summary(),
        "budget_s": budget_s,
        "seconds": round(sum(o.seconds for o in outcomes), 1),
        "steps": [vars(o) for o in outcomes],
    }
    (out_dir / FILES[0]).write_text(json.dumps(report, indent=2, default=str) + "\n")
    lines = ["| step | status | s | figures | targets |", "| --- | --- | --- | --- | --- |"]
    lines += [table_row(o) for o in outcomes]
    (out_dir / FILES[1]).write_text("\n".join(lines) + "\n")


def table_row(o: Outcome) -> str:
    figures = ", ".join(f"{k} {_fmt(v)}" for k, v in o.figures.items()) or "-"
    targets = ", ".join(f"{k} {'ok' if ok else 'MISSED'}" for k, ok in o.checks.items()) or "-"
    return f"| {o.name} | {o.status} | {o.seconds:.0f} | {figures} | {targets} |"


def _fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="bench.gpu_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    ap.add_argument("--out", type=Path, default=Path("bench/results/gpu_check"))
    budget_help = f"seconds for every step together (default {DEFAULT_BUDGET_S:.0f})"
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help=budget_help)
    ap.add_argument("--only", default="", help="comma-separated step names (default: all)")
    ap.add_argument("--list", action="store_true", help="print the steps and exit")
    return ap.parse_args(argv)


def select(only: str) -> list[Step]:
    """The steps named in ``only`` (all when empty), in the check's order."""
    names = [n for n in only.split(",") if n]
    unknown = sorted(set(names) - {s.name for s in STEPS})
    if unknown:
        known = ", ".join(s.name for s in STEPS)
        raise SystemExit(f"--only: no step named {', '.join(unknown)} (steps: {known})")
    return [s for s in STEPS if not names or s.name in names]


def plan_text(steps: list[Step], budget_s: float) -> str:
    """One line a step (its deadline: ``+`` when it also takes what is left), then the sum."""
    lines = []
    for step in steps:
        deadline = f"{step.timeout_s:5.0f} s{'+' if step.takes_rest else ' '}"
        lines.append(f"{step.name:18} {deadline} python {' '.join(step.argv(None))}")
    planned = budget_plan(steps)
    fits = "fits" if planned <= budget_s else "EXCEEDS"
    lines.append(f"deadlines + slack {planned:.0f} s: {fits} the budget of {budget_s:.0f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    steps = select(args.only)
    if args.list:
        print(plan_text(steps, args.budget_s))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a GPU machine (README: On a GPU)")
        return 2
    outcomes = run_check(steps, args.out, args.budget_s)
    print(f"wrote {', '.join(str(args.out / f) for f in FILES)}")
    return 0 if all(o.status == "passed" for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
