"""`splitserve generate`: offline generation with the engine, no cluster. The engine flags are
the nodes' (engine.config.EngineConfig's declarations, and the adapters to load:
models.lora_modules), checked alike."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from config_kit import add_flags, given_flags
from engine.config import EngineConfig
from engine.lora.request import LoRARequest
from models import ModelSource
from models.lora_modules import LoraModules, lora_module_map


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompts", nargs="+", metavar="PROMPT", help="one or more prompts")
    add_flags(parser, ModelSource)
    parser.add_argument("--raw", action="store_true", help="no chat template")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    engine = parser.add_argument_group("the engine's settings")
    add_flags(engine, EngineConfig)
    add_flags(engine, LoraModules)
    engine.add_argument(
        "--lora", default=None, metavar="NAME",
        help="generate under the adapter NAME of --lora-modules (default: the base model)",
    )  # fmt: skip


def _llm_options(args: argparse.Namespace) -> dict[str, Any]:
    """The engine flags given, as LLM keyword arguments (the others keep the defaults);
    adapters to load turn LoRA on, as on a node."""
    options = given_flags(args, EngineConfig)
    if args.lora_modules:
        options.setdefault("enable_lora", True)
    return options


def _lora_request(args: argparse.Namespace) -> LoRARequest | None:
    """The LoRARequest `--lora` names among `--lora-modules` (None: the base model);
    ValueError naming what does not fit."""
    modules = lora_module_map(args.lora_modules or [])
    if args.lora is None:
        if modules:
            raise ValueError("--lora-modules is given but no --lora names the adapter to use")
        return None
    if args.lora not in modules:
        known = ", ".join(modules) or "none given"
        raise ValueError(f"--lora {args.lora!r} is not one of --lora-modules ({known})")
    return LoRARequest(args.lora, 1, modules[args.lora])


def run(args: argparse.Namespace) -> int:
    from models import resolve_model

    try:
        lora = _lora_request(args)
        cache = Path(args.model_cache) if args.model_cache else None
        model_dir = resolve_model(args.model, cache, args.load_format != "random")
        from engine.llm import LLM
        from models.sampling_params import SamplingParams

        params = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
        )
        llm = LLM(model_dir, **_llm_options(args))
        if lora is not None:
            llm.engine.add_lora(lora)  # a bad adapter: LoraLoadError, naming its file
    except (ValueError, LookupError) as exc:
        print(f"splitserve: error: {exc}", file=sys.stderr)
        return 2
    prompts = args.prompts
    start = time.perf_counter()
    if args.raw:
        outputs = llm.generate(prompts, params, lora)
    else:
        outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, lora)
    elapsed = time.perf_counter() - start
    for prompt, out in zip(prompts, outputs, strict=True):
        print(f"> {prompt}\n{out.text}\n")
    n = sum(len(o.token_ids) for o in outputs)
    print(f"[{n} tokens in {elapsed:.2f} s, {n / elapsed:.1f} tok/s]", file=sys.stderr)
    return 0
