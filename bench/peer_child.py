"""A peer engine (vLLM or llama.cpp) timed on a list of prompts, run by the peer's own Python.

bench.peers starts ``PEER_PYTHON -c <this file>`` with a job on standard input and reads one
``PEER_RESULT {json}`` line back. This file imports nothing of the project (the peer's venv has
its own torch, transformers and vLLM), only the standard library and the peer.

Job: ``engine`` (``vllm`` or ``llama_cpp``), ``model`` (vLLM: the HF directory; llama.cpp: the
GGUF file), ``workloads`` (name -> ``prompts``, token ids, and ``one_at_a_time``: vLLM makes one
``generate`` call per prompt, else one for all; llama.cpp serves one sequence at a time either
way), ``new_tokens``, ``threads``, ``dtype`` (vLLM) and ``no_extra_bufts`` (llama.cpp: its
repacked weight layouts off). The model loads once, then the workloads run in order, greedy,
every prompt exactly ``new_tokens`` tokens; each one's time covers its generation only, as
wall time and as the CPU time of the process's threads (vLLM's engine core runs in this
process: bench.peers sets VLLM_ENABLE_V1_MULTIPROCESSING=0).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

RESULT_PREFIX = "PEER_RESULT "


def _all_prompts(job: dict[str, Any]) -> list[list[int]]:
    return [p for w in job["workloads"].values() for p in w["prompts"]]


def run_vllm(job: dict[str, Any]) -> dict[str, Any]:
    import vllm  # type: ignore[import-not-found,unused-ignore]
    from vllm.inputs import TokensPrompt  # type: ignore[import-not-found,unused-ignore]

    prompts = _all_prompts(job)
    llm = vllm.LLM(
        model=job["model"], dtype=job["dtype"], seed=0,
        max_num_seqs=max(len(w["prompts"]) for w in job["workloads"].values()),
        max_model_len=max(len(p) for p in prompts) + job["new_tokens"],
    )  # fmt: skip
    params = vllm.SamplingParams(temperature=0.0, max_tokens=job["new_tokens"], ignore_eos=True)

    def generate(batch: list[list[int]]) -> int:
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in batch], params,
                            use_tqdm=False)  # fmt: skip
        return sum(len(o.outputs[0].token_ids) for o in outs)

    generate([prompts[0][:8]])  # warm
    return {"workloads": _timed(job, generate), "version": vllm.__version__}


def _timed(job: dict[str, Any], generate: Any) -> dict[str, Any]:
    """Each workload's generation time and tokens; ``generate(prompts)`` -> tokens made."""
    out = {}
    for name, w in job["workloads"].items():
        prompts = w["prompts"]
        waves = [[p] for p in prompts] if w["one_at_a_time"] else [prompts]
        start, cpu = time.perf_counter(), time.process_time()
        tokens = sum(generate(wave) for wave in waves)
        out[name] = {"seconds": time.perf_counter() - start, "generated_tokens": tokens,
                     "cpu_seconds": time.process_time() - cpu}  # fmt: skip
    return out


def no_extra_bufts() -> None:
    """Model params with the extra buffer types off, for every Llama made after this."""
    import llama_cpp.llama_cpp as lc  # type: ignore[import-not-found,unused-ignore]

    default = lc.llama_model_default_params

    def params() -> Any:
        p = default()
        p.use_extra_bufts = False
        return p

    lc.llama_model_default_params = params


def run_llama_cpp(job: dict[str, Any]) -> dict[str, Any]:
    if job.get("no_extra_bufts"):
        no_extra_bufts()
    import llama_cpp  # type: ignore[import-not-found,unused-ignore]

    prompts, new_tokens, threads = _all_prompts(job), job["new_tokens"], job["threads"]
    llm = llama_cpp.Llama(
        model_path=job["model"], n_threads=threads, n_threads_batch=threads, seed=0,
        n_ctx=max(len(p) for p in prompts) + new_tokens + 16, verbose=False,
    )  # fmt: skip
    _generate(llm, prompts[0][:8], 2)  # warm

    def generate(batch: list[list[int]]) -> int:
        return sum(_generate(llm, p, new_tokens) for p in batch)

    return {"workloads": _timed(job, generate), "version": llama_cpp.__version__}


def _generate(llm: Any, prompt: list[int], new_tokens: int) -> int:
    """Greedy tokens after ``prompt`` (end of sequence ignored); how many."""
    llm.reset()
    n = 0
    for _ in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
        n += 1
        if n == new_tokens:
            break
    return n


def main() -> int:
    job = json.load(sys.stdin)
    run = {"vllm": run_vllm, "llama_cpp": run_llama_cpp}[job["engine"]]
    print(RESULT_PREFIX + json.dumps(run(job)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
