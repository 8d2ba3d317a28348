"""llguidance against xgrammar on this machine: grammar compile time and per-token mask time.

Each library compiles the same JSON schemas for the model's tokenizer, then walks a valid
instance of each schema token by token, computing the next-token mask before every token
(the work a constrained decode step adds). xgrammar is optional: it is measured only when
installed (it pulls torch, so splitserve does not depend on it). Also reported: whether
importing the library loads torch (the router must never load it).

    python -m bench.grammar_libs --model-dir DIR [--out grammar_libs.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.grammar_schemas import SCHEMAS

Walk = Callable[[list[int]], list[float]]


def _imports_torch(module: str) -> bool | None:
    code = f"import sys, {module}; print('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return run.stdout.strip() == "True" if run.returncode == 0 else None


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "mean_us": 1e6 * statistics.fmean(ordered),
        "p50_us": 1e6 * ordered[len(ordered) // 2],
        "p99_us": 1e6 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "max_us": 1e6 * ordered[-1],
    }


def _llguidance(model_dir: Path, eos: list[int]) -> tuple[float, Callable[[dict], Walk]]:
    import llguidance
    import llguidance.numpy

    start = time.perf_counter()
    text = (model_dir / "tokenizer.json").read_text()
    tok = llguidance.LLTokenizer(text, eos_token=eos)
    setup = time.perf_counter() - start

    def compile_schema(schema: dict) -> Walk:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
        matcher = llguidance.LLMatcher(tok, grammar)
        mask = llguidance.numpy.allocate_token_bitmask(1, tok.vocab_size)
        llguidance.numpy.fill_next_token_bitmask(matcher, mask)  # part of the compile

        def walk(tokens: list[int]) -> list[float]:
            times = []
            for t in tokens:
                t0 = time.perf_counter()
                llguidance.numpy.fill_next_token_bitmask(matcher, mask)
                times.append(time.perf_counter() - t0)
                if not matcher.consume_token(t):
                    raise RuntimeError(f"llguidance refused token {t}: {matcher.get_error()}")
            return times

        return walk

    return setup, compile_schema


def _xgrammar(model_dir: Path, vocab: int) -> tuple[float, Callable[[dict], Walk]]:
    import transformers
    import xgrammar as xgr

    start = time.perf_counter()
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    setup = time.perf_counter() - start

    def compile_schema(schema: dict) -> Walk:
        compiled = compiler.compile_json_schema(json.dumps(schema))
        matcher = xgr.GrammarMatcher(compiled)
        mask = xgr.allocate_token_bitmask(1, vocab)

        def walk(tokens: list[int]) -> list[float]:
            times = []
            for t in tokens:
                t0 = time.perf_counter()
                matcher.fill_next_token_bitmask(mask)
                times.append(time.perf_counter() - t0)
                if not matcher.accept_token(t):
                    raise RuntimeError(f"xgrammar refused token {t}")
            return times

        return walk

    return setup, compile_schema


def measure(
    name: str, setup_s: float, compile_schema: Callable[[dict], Walk], docs: list[list[int]]
) -> dict[str, Any]:
    compile_s, mask_s = [], []
    for (schema, _), tokens in zip(SCHEMAS, docs, strict=True):
        t0 = time.perf_counter()
        walk = compile_schema(schema)
        compile_s.append(time.perf_counter() - t0)
        mask_s.extend(walk(tokens))
    result: dict[str, Any] = {
        "library": name,
        "tokenizer_setup_s": setup_s,
        "schemas": len(SCHEMAS),
        "compile_ms": {k.replace("_us", "_ms"): v / 1e3 for k, v in _summary(compile_s).items()},
        "mask_per_token": _summary(mask_s),
        "tokens": len(mask_s),
    }
    comp, mask = result["compile_ms"], result["mask_per_token"]
    print(
        f"{name}: tokenizer {setup_s:.2f} s, compile mean {comp['mean_ms']:.2f} ms max "
        f"{comp['max_ms']:.2f} ms, mask/token mean {mask['mean_us']:.1f} us "
        f"p99 {mask['p99_us']:.1f} us"
    )
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("grammar_libs.json"))
    args = parser.parse_args(argv)
    from tokenizers import Tokenizer

    from engine.model.config import ModelConfig

    config = ModelConfig.from_dir(args.model_dir)
    eos = sorted(config.eos_token_ids)
    tok = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    docs = [
        tok.encode(json.dumps(doc), add_special_tokens=False).ids + eos[:1] for _, doc in SCHEMAS
    ]
    results: dict[str, Any] = {"vocab": config.vocab_size, "imports_torch": {}}
    for module in ("llguidance", "xgrammar"):
        results["imports_torch"][module] = _imports_torch(module)
    print("imports torch:", results["imports_torch"])
    results["llguidance"] = measure("llguidance", *_llguidance(args.model_dir, eos), docs)
    try:
        results["xgrammar"] = measure(
            "xgrammar", *_xgrammar(args.model_dir, config.vocab_size), docs
        )
    except ImportError:
        print("xgrammar: not installed, skipped")
    args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
