"""KV tiers below the device on a multiturn workload whose conversations outgrow the device
KV budget: prompt tokens computed and TTFT with the tiers against without, same run.

    python -m bench.kv_tiers --users 8 --turns 4 --device-blocks 96 --cpu-gb 1

One engine per configuration, in this process, on a random-weight model of the SmolLM2 shape
(--layers of it: the KV per token, and so the bytes a load moves, scale with them); the
greedy outputs of the two must be identical. Every
user sends its next turn as soon as its previous answer ended (bench/multiturn.py builds the
conversations: a shared system prompt, then each turn's prompt is the whole history). With
the device budget too small to keep every conversation, a user's prefix is evicted while the
others talk; without tiers it is recomputed, with them it is loaded from host memory. TTFT is
from a request's arrival at the engine to its first token. The same-run limit is the host's
memcpy bandwidth, beside the rate the tiers' copier measured.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, environment, memcpy_gbps, write_json
from bench.multiturn import Multiturn, parse_lengths
from bench.random_model import SHAPES, write_random_model_dir
from bench.workloads import RequestSpec
from engine.config import EngineConfig
from engine.engine import LLMEngine
from models.sampling_params import SamplingParams


def run(engine: LLMEngine, conversations: list[list[RequestSpec]]) -> dict[str, Any]:
    """Every conversation, each user's turns one after the other, all users at once."""
    queue = {user: list(turns) for user, turns in enumerate(conversations)}
    arrived: dict[str, float] = {}
    ttft: dict[str, float] = {}
    tokens: dict[str, list[int]] = {}
    computed = prompt = 0
    owner: dict[str, int] = {}

    def send(user: int) -> None:
        spec = queue[user].pop(0)
        rid = f"u{user}-{spec.kind}"
        params = SamplingParams(max_tokens=spec.max_tokens, temperature=0.0, ignore_eos=True)
        engine.add_request(rid, spec.prompt_ids, params)
        arrived[rid], owner[rid] = time.perf_counter(), user

    for user in queue:
        send(user)
    start = time.perf_counter()
    while engine.has_unfinished():
        for out in engine.step():
            now = time.perf_counter()
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.request_id not in ttft:
                ttft[out.request_id] = now - arrived[out.request_id]
                computed += out.num_prompt_tokens - out.num_cached_tokens
                prompt += out.num_prompt_tokens
            if out.finished and queue[owner[out.request_id]]:
                send(owner[out.request_id])
    seconds = time.perf_counter() - start
    times = sorted(ttft.values())
    counters = engine.counters
    return {
        "requests": len(times),
        "seconds": seconds,
        "prompt_tokens": prompt,
        "computed_prompt_tokens": computed,
        "tokens_computed": counters.tokens_computed,
        "ttft_p50_s": statistics.median(times),
        "ttft_p90_s": times[int(0.9 * (len(times) - 1))],
        "preemptions": counters.preemptions,
        "preemptions_swap": counters.preemptions_swap,
        "kv_tiers": dict(counters.kv_tiers),
        "tokens": tokens,
    }


def build(model_dir: Path, args: argparse.Namespace, **tiers: Any) -> LLMEngine:
    config = EngineConfig(
        model_dir=model_dir,
        load_format="random",
        block_size=16,
        num_kv_blocks=args.device_blocks,
        max_num_seqs=args.users,
        max_num_batched_tokens=args.budget,
        **tiers,
    )
    return LLMEngine(config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--system", type=int, default=128, help="system prompt tokens")
    parser.add_argument("--question-tokens", type=parse_lengths, default="16:64:lognormal")
    parser.add_argument("--answer-tokens", type=parse_lengths, default="8:24")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2", help="model shape")
    parser.add_argument("--layers", type=int, default=12, help="layers of that shape")
    parser.add_argument("--device-blocks", type=int, default=96, help="device KV blocks of 16")
    parser.add_argument("--budget", type=int, default=512, help="tokens per step")
    parser.add_argument("--cpu-gb", type=float, default=1.0, help="host tier GiB")
    parser.add_argument("--disk-gb", type=float, default=0.0, help="disk tier GiB (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "kv_tiers.json")
    args = parser.parse_args(argv)
    shape = Multiturn(
        users=args.users, turns=args.turns, system=args.system,
        question=args.question_tokens, answer=args.answer_tokens, think_s=0.0,
    )  # fmt: skip
    conversations = shape.conversations(args.seed, SHAPES[args.shape]["vocab_size"])
    with tempfile.TemporaryDirectory(prefix="kv-tiers-") as tmp:
        layers = {"num_hidden_layers": args.layers}
        model_dir = write_random_model_dir(args.shape, Path(tmp) / "model", **layers)
        tiers: dict[str, Any] = {"kv_offload_cpu_gb": args.cpu_gb}
        if args.disk_gb > 0:
            tiers |= {"kv_offload_disk_path": Path(tmp) / "kv", "kv_offload_disk_gb": args.disk_gb}
        plain = run(build(model_dir, args), conversations)
        tiered_engine = build(model_dir, args, **tiers)
        tiered = run(tiered_engine, conversations)
        assert tiered_engine.kv_tiers is not None
        copier_gbps = tiered_engine.kv_tiers.copier.copy_bytes_per_s / 1e9
        tiered_engine.close()
    block_bytes = tiered_engine.runner.layout.block_bytes
    result = {
        "workload": {k: str(v) for k, v in vars(args).items()},
        "environment": environment(),
        "block_bytes": block_bytes,
        "memcpy_gbps": memcpy_gbps(64 << 20),
        "copier_gbps": copier_gbps,
        "without_tiers": plain,
        "with_tiers": tiered,
        "computed_prompt_tokens_ratio": plain["computed_prompt_tokens"]
        / max(tiered["computed_prompt_tokens"], 1),
        "ttft_p50_ratio": plain["ttft_p50_s"] / tiered["ttft_p50_s"],
        "outputs_identical": plain.pop("tokens") == tiered.pop("tokens"),
    }
    write_json(args.out, result)
    for name, r in (("without tiers", plain), ("with tiers", tiered)):
        print(
            f"{name:>14}: prompt tokens {r['prompt_tokens']}, computed "
            f"{r['computed_prompt_tokens']}, TTFT p50 {1e3 * r['ttft_p50_s']:.1f} ms "
            f"p90 {1e3 * r['ttft_p90_s']:.1f} ms, {r['seconds']:.1f} s"
        )
    t = tiered["kv_tiers"]
    print(
        f"computed prompt tokens: {result['computed_prompt_tokens_ratio']:.2f}x fewer with tiers; "
        f"TTFT p50 {result['ttft_p50_ratio']:.2f}x; host hits {t.get('host_hits', 0):.0f} "
        f"blocks ({t.get('host_bytes_out', 0) / 1e6:.1f} MB loaded); copier "
        f"{copier_gbps:.2f} GB/s against memcpy {result['memcpy_gbps']:.2f} GB/s"
    )
    print(f"greedy outputs identical: {result['outputs_identical']}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
