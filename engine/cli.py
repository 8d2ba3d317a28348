"""`splitserve generate`: offline generation with the engine, no cluster. The engine flags
(quantization, KV cache dtype, LoRA) are the nodes' (engine.flags), checked alike."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from engine.flags import ENGINE_FLAGS, add_lora_switches, flag
from engine.lora.request import LoRARequest
from models.cli import add_model_cache_flag
from models.lora_modules import lora_module_map


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompts", nargs="+", metavar="PROMPT", help="one or more prompts")
    parser.add_argument("--model", default="smollm2", help="registry name or HF model directory")
    add_model_cache_flag(parser)
    parser.add_argument("--raw", action="store_true", help="no chat template")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    _add_engine_flags(parser)


def _add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """The nodes' engine flags, their choices the engine's own (torch loads here: generate
    runs the engine anyway)."""
    from engine.kv_format.dtypes import KV_CACHE_DTYPES
    from engine.model.quant import QUANTIZATIONS

    choices = {"quantization": QUANTIZATIONS, "kv_cache_dtype": KV_CACHE_DTYPES}
    for name, help_text in ENGINE_FLAGS.items():
        kind = str if name in choices else int
        parser.add_argument(
            flag(name), type=kind, choices=choices.get(name), default=None, help=help_text
        )
    add_lora_switches(parser)
    parser.add_argument(
        "--lora", default=None, metavar="NAME",
        help="generate under the adapter NAME of --lora-modules (default: the base model)",
    )  # fmt: skip


def _llm_options(args: argparse.Namespace) -> dict[str, Any]:
    """The engine flags given, as LLM keyword arguments (the others keep the defaults);
    of --lora-modules, the adapter --lora names is loaded by itself."""
    names = (*ENGINE_FLAGS, "enable_lora")
    return {n: getattr(args, n) for n in names if getattr(args, n) is not None}


def _lora_request(args: argparse.Namespace) -> LoRARequest | None:
    """The LoRARequest `--lora` names among `--lora-modules` (None: the base model);
    ValueError naming what does not fit."""
    modules = lora_module_map(args.lora_modules or [], bool(args.enable_lora))
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
        llm = LLM(model_dir, dtype=args.dtype, device=args.device, **_llm_options(args))
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
