"""How many greedy continuations a quantized KV cache keeps: the default model (or ``--model
DIR``) answers each chat prompt with a float32 cache and with ``--kv-cache-dtype`` (int8 by
default), 48 tokens each, greedy, and counts the prompts whose tokens are all the same; for
the others it prints where they part and float32's top-2 log-probability gap there.

    python -m bench.kv_greedy [--prompts unseen|oracle] [--widths 8,16] [--model DIR]

``unseen``: 12 chat prompts that no test reads (``UNSEEN``); ``oracle``: the int8 oracle
test's 12. Each vector width of the CPU kernels (``SPLITSERVE_CPU_VEC_WIDTH``; 8 is the AVX2
build) runs in a process of its own, since a process loads one build.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.oracle_prompts import PROMPTS as ORACLE_PROMPTS

if TYPE_CHECKING:
    from engine.outputs import GenerationOutput

UNSEEN = [  # chat prompts that no test reads: mixed tasks, lengths and languages
    "What is the difference between weather and climate?",
    "Write a limerick about a cat who loves cheese.",
    "Give three tips for staying focused while studying.",
    "How does a refrigerator keep food cold?",
    "Name five animals that live in the Arctic.",
    "What is 144 divided by 12? Show your steps.",
    "Write a short thank-you note to a neighbour who watered my plants.",
    "Explain recursion to a ten-year-old.",
    "What causes the seasons on Earth?",
    "Describe a busy train station at rush hour in three sentences.",
    "Wie viele Tage hat ein Schaltjahr, und warum?",
    "Write a SQL query that counts the orders per customer in a table named orders.",
]
PROMPT_SETS = {"unseen": UNSEEN, "oracle": ORACLE_PROMPTS[:12]}
NEW_TOKENS = 48


@dataclass(frozen=True)
class Parting:
    """Where a prompt's answer left the reference's: its index, the first token that differs,
    and the reference's top-2 log-probability gap at that token (nats)."""

    prompt: int
    token: int
    gap: float


def partings(want: Sequence[GenerationOutput], got: Sequence[GenerationOutput]) -> list[Parting]:
    """The prompts whose greedy tokens differ from the reference's (run with logprobs >= 2)."""
    out = []
    for i, (ref, run) in enumerate(zip(want, got, strict=True)):
        pairs = zip(ref.token_ids, run.token_ids, strict=True)
        step = next((j for j, (a, b) in enumerate(pairs) if a != b), None)
        if step is None:
            continue
        if ref.logprobs is None or len(ref.logprobs[step].top) < 2:
            raise ValueError(f"prompt {i}: the reference has no top-2 logprobs at token {step}")
        (_, first), (_, second) = ref.logprobs[step].top[:2]
        out.append(Parting(i, step, first - second))
    return out


def greedy(
    model_dir: Path, prompts: list[list[int]], kv_cache_dtype: str, new_tokens: int = NEW_TOKENS
) -> list[GenerationOutput]:
    """Greedy answers of ``new_tokens`` tokens each (EOS ignored), with top-2 logprobs."""
    from engine.llm import LLM
    from models.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True, logprobs=2)
    llm = LLM(model_dir, num_kv_blocks=256, kv_cache_dtype=kv_cache_dtype)
    try:
        return llm.generate(prompts, params)
    finally:
        llm.close()


def run_width(model_dir: Path, texts: list[str], kv_cache_dtype: str) -> dict[str, Any]:
    """This process's build of the kernels: float32 KV against ``kv_cache_dtype``."""
    from engine import cpu_kernels
    from models.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(model_dir)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": t}]) for t in texts]
    fp32 = greedy(model_dir, prompts, "auto")
    parted = partings(fp32, greedy(model_dir, prompts, kv_cache_dtype))
    return {
        "width": cpu_kernels.vec_width() if cpu_kernels.available() else None,
        "kept": len(prompts) - len(parted),
        "of": len(prompts),
        "parted": [asdict(p) for p in parted],
    }


def _child(args: argparse.Namespace, width: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.kv_greedy", "--one", "--model", str(args.model)]
    cmd += ["--prompts", args.prompts, "--kv-cache-dtype", args.kv_cache_dtype]
    env = dict(os.environ, SPLITSERVE_CPU_VEC_WIDTH=width)
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--prompts", choices=sorted(PROMPT_SETS), default="unseen")
    parser.add_argument("--widths", default="8,16", help="CPU kernel vector widths, one run each")
    parser.add_argument("--kv-cache-dtype", default="int8")
    parser.add_argument("--model", type=Path, default=None, help="HF directory (default model)")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child's run
    args = parser.parse_args()
    if args.model is None:
        from models import ensure_model

        args.model = ensure_model("smollm2")
    if args.one:
        print(json.dumps(run_width(args.model, PROMPT_SETS[args.prompts], args.kv_cache_dtype)))
        return
    for width in args.widths.split(","):
        result = _child(args, width.strip())
        print(
            f"width {result['width']}: {args.kv_cache_dtype} KV kept {result['kept']} of "
            f"{result['of']} {args.prompts} prompts' {NEW_TOKENS} float32 greedy tokens"
        )
        for p in result["parted"]:
            print(f"  prompt {p['prompt']}: parts at token {p['token']}, gap {p['gap']:.3f}")


if __name__ == "__main__":
    main()
