"""`splitserve generate`: offline generation with the engine, no cluster."""

from __future__ import annotations

import argparse
import sys
import time

from config_kit import add_flags, given_flags
from engine.config import EngineConfig
from models import ModelSource


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompts", nargs="+", metavar="PROMPT", help="one or more prompts")
    add_flags(parser, ModelSource)
    parser.add_argument("--raw", action="store_true", help="no chat template")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    add_flags(parser.add_argument_group("the engine's settings"), EngineConfig)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from models import resolve_model

    try:
        model_dir = resolve_model(args.model, Path(args.model_cache) if args.model_cache else None)
        from engine.llm import LLM
        from models.sampling_params import SamplingParams

        params = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
        )
        llm = LLM(model_dir, **given_flags(args, EngineConfig))
    except ValueError as exc:
        print(f"splitserve: error: {exc}", file=sys.stderr)
        return 2
    prompts = args.prompts
    start = time.perf_counter()
    if args.raw:
        outputs = llm.generate(prompts, params)
    else:
        outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params)
    elapsed = time.perf_counter() - start
    for prompt, out in zip(prompts, outputs, strict=True):
        print(f"> {prompt}\n{out.text}\n")
    n = sum(len(o.token_ids) for o in outputs)
    print(f"[{n} tokens in {elapsed:.2f} s, {n / elapsed:.1f} tok/s]", file=sys.stderr)
    return 0
