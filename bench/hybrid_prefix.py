"""A hybrid model's prefix-cache hit from a state checkpoint: the prefill of a prompt that
repeats an earlier one's first blocks and goes on (a chat's next turn), with the checkpoint
the first prompt saved at its last block boundary and without checkpoints
(``linear_state_checkpoints=0``: computed whole).

    python -m bench.hybrid_prefix [--shape qwen3-next-cpu] [--prompt-tokens 1024]
                                  [--next-tokens 64] [--repeats 3] [--out PATH]

Random weights of the shape, random token ids. The limit of the same run: the speedup the
tokens alone would give (the second prompt's tokens over those computed after the hit).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import cpu_identity, write_json
from bench.random_model import SHAPES, write_random_model_dir
from engine.config import EngineConfig
from engine.engine import LLMEngine
from models.sampling_params import SamplingParams

BLOCK = 16
ONE_TOKEN = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


def prefill_seconds(engine: LLMEngine, rid: str, prompt: list[int]) -> tuple[float, int]:
    """Seconds to the prompt's first token, and its tokens found cached."""
    started = time.perf_counter()
    engine.add_request(rid, prompt, ONE_TOKEN)
    cached = 0
    while engine.has_unfinished():
        for out in engine.step():
            cached = out.num_cached_tokens
    return time.perf_counter() - started, cached


def run(model_dir: Path, checkpoints: int, args: argparse.Namespace) -> dict[str, Any]:
    engine = LLMEngine(
        EngineConfig(
            model_dir=model_dir, load_format="random", block_size=BLOCK,
            max_num_batched_tokens=args.prompt_tokens + args.next_tokens,
            linear_state_checkpoints=checkpoints,
        )
    )  # fmt: skip
    rng, vocab = random.Random(0), engine.model_config.vocab_size
    times, cached = [], 0
    for k in range(args.repeats):
        first = [rng.randrange(vocab) for _ in range(args.prompt_tokens)]
        prefill_seconds(engine, f"first{k}", first)
        then = first + [rng.randrange(vocab) for _ in range(args.next_tokens)]
        seconds, cached = prefill_seconds(engine, f"next{k}", then)
        times.append(seconds)
    median = sorted(times)[len(times) // 2]
    return {"prefill_s": median, "runs_s": times, "cached_tokens": cached}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-next-cpu")
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--next-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_random_model_dir(args.shape, Path(tmp))
        hit, whole = run(model_dir, 4, args), run(model_dir, 0, args)
    total = args.prompt_tokens + args.next_tokens
    result = {
        "shape": args.shape, "cpu": cpu_identity(), "prompt_tokens": args.prompt_tokens,
        "next_tokens": args.next_tokens, "with_checkpoints": hit, "without": whole,
        "speedup": whole["prefill_s"] / hit["prefill_s"],
        "token_limit": total / (total - hit["cached_tokens"]),
    }  # fmt: skip
    print(json.dumps(result, indent=2))
    if args.out is not None:
        write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
