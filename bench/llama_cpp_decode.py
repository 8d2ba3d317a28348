"""Batch-1 greedy decode of a GGUF through llama.cpp (llama-cpp-python), in a child process.

llama.cpp can die of a signal inside its own kernels (its AMX weight repacking crashed in
``ggml_backend_amx_mul_mat`` on the 2-core dev VM), so ``run`` starts this module as a child
and, when the child dies of a signal, tries once more with llama.cpp's extra buffer types
(the repacked weight layouts) off. The child prefills the given token ids, decodes
``warmup`` tokens untimed, then times ``steps`` decode tokens one by one and prints one line
of JSON: the median and mean time a token (and the median CPU time of its threads).

    python -m bench.llama_cpp_decode GGUF --threads 2 --steps 16 --prompt 1,2,3 [--no-extra-bufts]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.peer_child import no_extra_bufts

WARMUP_TOKENS = 3  # decode tokens after the prefill before the timed ones (as bench.decode_step)
CHILD_TIMEOUT_S = 600.0


def importable() -> bool:
    """Whether llama_cpp (the optional bench-llamacpp extra) imports here."""
    done = subprocess.run(
        [sys.executable, "-c", "import llama_cpp"], capture_output=True, timeout=CHILD_TIMEOUT_S
    )
    return done.returncode == 0


def run(gguf: Path, prompt: list[int], threads: int, steps: int) -> dict[str, Any]:
    """Decode timing of llama.cpp on ``gguf``: the child's report plus ``mode`` (``default``
    or ``no_extra_bufts``) and ``failed`` (the modes whose child died, with why)."""
    failed: list[dict[str, Any]] = []
    for mode in ("default", "no_extra_bufts"):
        cmd = [
            sys.executable, "-m", "bench.llama_cpp_decode", str(gguf), "--threads", str(threads),
            "--steps", str(steps), "--prompt", ",".join(map(str, prompt)),
        ]  # fmt: skip
        if mode == "no_extra_bufts":
            cmd.append("--no-extra-bufts")
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
        if done.returncode == 0:
            report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
            return report | {"mode": mode, "failed": failed}
        failed.append({"mode": mode, "returncode": done.returncode, "stderr": done.stderr[-500:]})
        if done.returncode >= 0:  # an error, not a crash: a second mode will not help
            break
    raise RuntimeError(f"llama.cpp decode failed: {failed}")


def _decode(gguf: Path, prompt: list[int], threads: int, steps: int) -> dict[str, Any]:
    from llama_cpp import Llama  # type: ignore[import-not-found,unused-ignore]

    llm = Llama(
        model_path=str(gguf), n_threads=threads, n_threads_batch=threads,
        n_ctx=len(prompt) + WARMUP_TOKENS + steps + 16, verbose=False,
    )  # fmt: skip
    times, cpu_times = [], []
    last, last_cpu = time.perf_counter(), time.process_time()
    for i, _ in enumerate(llm.generate(prompt, top_k=1, temp=0.0)):
        now, now_cpu = time.perf_counter(), time.process_time()
        if i > WARMUP_TOKENS:  # token 0 comes with the prefill
            times.append(now - last)
            cpu_times.append(now_cpu - last_cpu)
        last, last_cpu = now, now_cpu
        if len(times) == steps:
            break
    return {
        "threads": threads,
        "steps": len(times),
        "median_token_s": statistics.median(times),
        "mean_token_s": statistics.fmean(times),
        # CPU time of all its threads: on a machine loaded by other work, less of their noise
        "median_token_cpu_s": statistics.median(cpu_times),
        "tok_s": 1.0 / statistics.median(times),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--prompt", required=True, help="token ids, comma-separated")
    ap.add_argument("--no-extra-bufts", action="store_true")
    args = ap.parse_args(argv)
    if args.no_extra_bufts:
        no_extra_bufts()
    prompt = [int(t) for t in args.prompt.split(",")]
    print(json.dumps(_decode(args.gguf, prompt, args.threads, args.steps)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
