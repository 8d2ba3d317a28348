"""Multi-LoRA decode throughput against the base model alone, same run.

    python -m bench.lora [--model smollm2] [--batch-size 8] [--new-tokens 32] [--rank 16]
                         [--adapters 4] [--device cpu] [--out bench/results/lora.json]

A batch of B random-token prompts decodes greedily twice per arm, in the order base, lora,
lora, base (each arm keeps its faster run): `base` runs every row on the base model (no
adapter enabled in that engine), `lora` spreads the rows over `--adapters` random adapters
(all seven projections, the given rank) in one batch. Decode throughput is the tokens of the
steps after every row has its first token, over those steps' time. The figure is the ratio
lora / base (target >= 0.8). The adapters are written in the PEFT layout by this script
(no peft needed).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from bench.common import RESULTS_DIR, environment, write_json

TARGETS = {
    "self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
}


def write_adapter(model_dir: Path, out: Path, rank: int, seed: int) -> Path:
    """A random adapter of every projection of the model in `model_dir`, PEFT layout."""
    cfg = json.loads((model_dir / "config.json").read_text())
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    shapes = {  # module -> (out, in)
        "q_proj": (heads * head_dim, hidden), "k_proj": (kv_heads * head_dim, hidden),
        "v_proj": (kv_heads * head_dim, hidden), "o_proj": (hidden, heads * head_dim),
        "gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter),
    }  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for part, modules in TARGETS.items():
            for module in modules:
                n_out, n_in = shapes[module]
                key = f"base_model.model.model.layers.{layer}.{part}.{module}"
                tensors[f"{key}.lora_A.weight"] = torch.randn(rank, n_in, generator=g) / n_in**0.5
                tensors[f"{key}.lora_B.weight"] = torch.randn(n_out, rank, generator=g) * 0.01
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": list(shapes),
        "peft_type": "LORA",
    }
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


def decode_rate(llm: Any, prompts: list[list[int]], loras: list[Any], new_tokens: int) -> float:
    """Tokens per second of the steps after every row has its first token."""
    from models.sampling_params import SamplingParams

    engine = llm.engine
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    for i, (prompt, lora) in enumerate(zip(prompts, loras, strict=True)):
        engine.add_request(f"bench-{time.monotonic_ns()}-{i}", prompt, params, lora=lora)
    started: set[str] = set()
    tokens, t0 = 0, 0.0
    while engine.has_unfinished():
        outs = engine.step()
        if len(started) == len(prompts):
            tokens += sum(len(o.new_token_ids) for o in outs)
        else:
            started.update(o.request_id for o in outs)
            if len(started) == len(prompts):
                t0 = time.perf_counter()
    return tokens / (time.perf_counter() - t0)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from engine import LLM, LoRARequest
    from models import ensure_model

    model_dir = ensure_model(args.model)
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 30000) for _ in range(64)] for _ in range(args.batch_size)]
    common = dict(device=args.device, max_num_batched_tokens=1024, num_kv_blocks=1024)
    with tempfile.TemporaryDirectory() as tmp:
        adapters = [
            LoRARequest(
                f"bench{i}", i + 1, write_adapter(model_dir, Path(tmp) / str(i), args.rank, i)
            )
            for i in range(args.adapters)
        ]
        base = LLM(model_dir, **common)
        lora = LLM(
            model_dir, enable_lora=True, max_loras=args.adapters, max_lora_rank=args.rank,
            **common,
        )  # fmt: skip
        mixed = [adapters[i % len(adapters)] for i in range(len(prompts))]
        none: list[Any] = [None] * len(prompts)
        decode_rate(lora, prompts[:1], mixed[:1], 2)  # warm up: adapters read, kernels built
        rates: dict[str, list[float]] = {"base": [], "lora": []}
        for arm in ("base", "lora", "lora", "base"):
            llm, loras = (base, none) if arm == "base" else (lora, mixed)
            rates[arm].append(decode_rate(llm, prompts, loras, args.new_tokens))
    best = {arm: max(values) for arm, values in rates.items()}
    return {
        "benchmark": "lora_decode",
        "model": args.model,
        "batch_size": args.batch_size,
        "adapters": args.adapters,
        "rank": args.rank,
        "new_tokens": args.new_tokens,
        "base_decode_tok_s": round(best["base"], 1),
        "lora_decode_tok_s": round(best["lora"], 1),
        "ratio": round(best["lora"] / best["base"], 3),
        "target": 0.8,
        "environment": environment(),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "lora.json")
    args = ap.parse_args(argv)
    report = run(args)
    print(json.dumps(report, indent=2))
    print(f"wrote {write_json(args.out, report)}")


if __name__ == "__main__":
    main()
