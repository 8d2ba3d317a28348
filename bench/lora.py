"""Multi-LoRA decode throughput against the base model alone, same run.

    python -m bench.lora [--model smollm2] [--batch-size 8] [--new-tokens 32] [--rank 16]
                         [--adapters 4] [--rounds 3] [--device cpu]
                         [--out bench/results/lora.json]

A batch of B random-token prompts decodes greedily in two engines at once, their steps
interleaved (base, lora, lora, base, ...), so both arms see the same machine load: `base` runs
every row on the base model (no adapter enabled in that engine), `lora` spreads the rows over
`--adapters` random adapters (all seven projections, the given rank) in one batch. An arm's
decode throughput is the tokens of its steps after every row has its first token, over those
steps' own time, pooled over the rounds. The figure is the ratio lora / base (target >= 0.8).
The adapters are written in the PEFT layout by this script (no peft needed).
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


def _start(llm: Any, prompts: list[list[int]], loras: list[Any], new_tokens: int) -> Any:
    """The engine with the batch added and stepped until every row has its first token."""
    from models.sampling_params import SamplingParams

    engine = llm.engine
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    for i, (prompt, lora) in enumerate(zip(prompts, loras, strict=True)):
        engine.add_request(f"bench-{time.monotonic_ns()}-{i}", prompt, params, lora=lora)
    started: set[str] = set()
    while len(started) < len(prompts):
        started.update(o.request_id for o in engine.step())
    return engine


def decode_rates(
    arms: dict[str, tuple[Any, list[Any]]], prompts: list[list[int]], n: int
) -> dict[str, float]:
    """Tokens per second of each arm's decode steps, the arms' steps interleaved (the first
    arm first on even steps, last on odd ones)."""
    engines = {arm: _start(llm, prompts, loras, n) for arm, (llm, loras) in arms.items()}
    tokens, seconds = dict.fromkeys(engines, 0), dict.fromkeys(engines, 0.0)
    order = list(engines)
    while any(e.has_unfinished() for e in engines.values()):
        for arm in order:
            if engines[arm].has_unfinished():
                t0 = time.perf_counter()
                outs = engines[arm].step()
                seconds[arm] += time.perf_counter() - t0
                tokens[arm] += sum(len(o.new_token_ids) for o in outs)
        order.reverse()
    return {arm: tokens[arm] / seconds[arm] for arm in engines}


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
        arms = {"base": (base, none), "lora": (lora, mixed)}
        warm = {arm: (llm, loras[:2]) for arm, (llm, loras) in arms.items()}
        decode_rates(warm, prompts[:2], 3)  # warm up: adapters read, kernels built
        rates: dict[str, list[float]] = {"base": [], "lora": []}
        for _ in range(args.rounds):
            for arm, rate in decode_rates(arms, prompts, args.new_tokens).items():
                rates[arm].append(rate)
    # pooled: every round decodes the same tokens, so the mean of the times
    pooled = {arm: len(v) / sum(1 / r for r in v) for arm, v in rates.items()}
    return {
        "benchmark": "lora_decode",
        "model": args.model,
        "batch_size": args.batch_size,
        "adapters": args.adapters,
        "rank": args.rank,
        "new_tokens": args.new_tokens,
        "runs": rates,
        "base_decode_tok_s": round(pooled["base"], 1),
        "lora_decode_tok_s": round(pooled["lora"], 1),
        "ratio": round(pooled["lora"] / pooled["base"], 3),
        "target": 0.8,
        "environment": environment(),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved runs of both arms")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "lora.json")
    args = ap.parse_args(argv)
    report = run(args)
    print(json.dumps(report, indent=2))
    print(f"wrote {write_json(args.out, report)}")


if __name__ == "__main__":
    main()
