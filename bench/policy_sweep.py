"""Routing policies compared on one seeded `multiturn` run.

    python -m bench.policy_sweep --prefill 2 --decode 2 --threads-per-node 1 \\
        --policies round_robin,least_loaded,kv_aware --users 10 --turns 8 --rate 0.5

For each policy (and each of --rounds, the policies interleaved) a fresh `splitserve up`
starts with cold caches, the same conversations run against it (bench/multiturn.py), and it
stops. Per policy it reports the prompt tokens the cluster computed (the requests' prompt
minus the cached tokens their usage reports; the prefill nodes' own counter as a check),
their ratio to the first policy's, and TTFT / TPOT percentiles over every round's requests.
A count of tokens is robust on a shared machine; latencies are not: read them with the load.
It also reports, from the router's metrics, the share of requests sent to the node with the
longest cached prefix, the blocks the decode nodes read, and the tokens a perfect router
would compute on the same conversations.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, write_json
from bench.multiturn import Multiturn, format_lengths, parse_lengths, prefix_summary
from bench.serve import DEFAULT_SLO, MULTITURN, SMOLLM2_VOCAB, ServeConfig, run_sweep
from bench.serve_client import LoadOptions
from bench.serve_stats import summarize
from bench.up_child import UpChild

POLICIES = ("round_robin", "least_loaded", "kv_aware")


class Up(UpChild):
    """One `splitserve up` child, started with cold caches and stopped with SIGINT."""

    def __init__(self, policy: str, args: argparse.Namespace, run_dir: Path) -> None:
        up_args = ["--policy", policy, "--prefill", str(args.prefill)]
        up_args += ["--decode", str(args.decode), *args.up_args]
        if args.threads_per_node:
            up_args += ["--threads-per-node", str(args.threads_per_node)]
        super().__init__(up_args, run_dir)

    def prefill_tokens_computed(self) -> int:
        """The prefill nodes' engine counter, summed (prompt tokens run through the model)."""
        return self._counter_sum("prefill", "tokens_computed")

    def decode_imported_blocks(self) -> int:
        """Blocks the decode nodes read from prefill nodes (the rest they held already)."""
        return self._counter_sum("decode", "imported_blocks_total")

    def _counter_sum(self, role: str, counter: str) -> int:
        nodes = self.node_urls(role).values()
        return sum(int(self.stats(url)["counters"].get(counter, 0)) for url in nodes)

    def router_kv(self) -> dict[str, dict[str, float]]:
        """Per pool, from the router's /metrics: requests routed to the node with the longest
        cached prefix (as the index saw it), to a shorter one, or with none anywhere; and the
        prefix-hit tokens the index predicted against those the nodes reported."""
        out: dict[str, dict[str, float]] = {}
        names = {
            "splitserve_router_kv_routed_requests_total": "match",
            "splitserve_router_kv_predicted_hit_tokens_total": "predicted_hit_tokens",
            "splitserve_router_kv_actual_hit_tokens_total": "actual_hit_tokens",
        }
        for sample in self.router_samples():
            key = names.get(sample.name)
            if key is None:
                continue
            pool = out.setdefault(sample.labels["pool"], {})
            key = f"routed_{sample.labels['match']}" if key == "match" else key
            pool[key] = pool.get(key, 0.0) + sample.value
        return out


def _config(args: argparse.Namespace, url: str, policy: str) -> ServeConfig:
    shape = Multiturn(users=args.users, turns=args.turns, system=args.system_tokens,
                      question=args.question_tokens, answer=args.answer_tokens,
                      think_s=args.think_time)  # fmt: skip
    return ServeConfig(
        url=url, model=None, workload=MULTITURN, rates=(args.rate,), num_requests=1,
        duration_s=None, max_prompt=None, max_output=None, vocab_size=SMOLLM2_VOCAB,
        seed=args.seed, slo=DEFAULT_SLO, load=LoadOptions(args.timeout, progress=False),
        warmup=0, label=policy, multiturn=shape,
    )  # fmt: skip


def run_policy(policy: str, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    up = Up(policy, args, run_dir)
    try:
        before, imported = up.prefill_tokens_computed(), up.decode_imported_blocks()
        result = asyncio.run(run_sweep(_config(args, up.url, policy), None))
        computed = up.prefill_tokens_computed() - before
        imported = up.decode_imported_blocks() - imported
        kv = up.router_kv()
    finally:
        up.stop()
    point = result["points"][0]
    load = os.getloadavg()[0]  # the machine's 1-minute load at the end: latencies need it
    return {"policy": policy, "prefill_node_tokens_computed": computed,
            "decode_imported_blocks": imported, "router_kv": kv, "load_1m": load,
            **point}  # fmt: skip


def aggregate(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per policy: every round's records pooled, then summarized."""
    out: dict[str, dict[str, Any]] = {}
    for policy in dict.fromkeys(r["policy"] for r in runs):
        mine = [r for r in runs if r["policy"] == policy]
        records = [rec for r in mine for rec in r["records"]]
        duration = sum(r["duration_s"] for r in mine)
        summary = summarize(records, duration, None, DEFAULT_SLO)
        summary["prefix"] = prefix_summary(records)
        for key in ("prefill_node_tokens_computed", "decode_imported_blocks"):
            summary[key] = sum(r[key] for r in mine)
        kv: dict[str, dict[str, float]] = {}
        for r in mine:
            for pool, values in r["router_kv"].items():
                for key, value in values.items():
                    kv.setdefault(pool, {})[key] = kv.get(pool, {}).get(key, 0.0) + value
        summary["router_kv"] = kv
        out[policy] = summary
    return out


def fewest_computed(shape: Multiturn, seed: int, prefill_nodes: int, block_size: int = 16) -> int:
    """Prompt tokens a perfect router computes on the prefill pool, caches never evicting:
    each turn on the node holding the conversation's previous prompt (so only the tokens after
    that prompt's last full block), each turn 1 after its node's first on the cached system
    prompt, and at least one token per request (as the engine)."""

    def reusable(prompt_len: int, prefix_len: int) -> int:
        return min(prefix_len // block_size, (prompt_len - 1) // block_size) * block_size

    total = 0
    for turn_no, turns in enumerate(shape.conversations(seed, SMOLLM2_VOCAB)):
        prev = shape.system if turn_no >= prefill_nodes else 0
        for spec in turns:
            total += len(spec.prompt_ids) - reusable(len(spec.prompt_ids), prev)
            prev = len(spec.prompt_ids)
    return total


def longest_share(kv: dict[str, dict[str, float]], pool: str) -> float | None:
    """Of the requests routed in `pool` while some candidate held a prefix, the share that
    went to a node holding the longest one (None when there were none)."""
    counts = kv.get(pool, {})
    longest, shorter = counts.get("routed_longest", 0.0), counts.get("routed_shorter", 0.0)
    return longest / (longest + shorter) if longest + shorter else None


def table(summaries: dict[str, dict[str, Any]]) -> str:
    base_name = next(iter(summaries))
    base = summaries[base_name]
    head = (
        "| policy | requests ok | prompt tokens | computed | computed by prefill nodes "
        f"| computed vs {base_name} | TTFT p50 ms | TTFT p50 vs {base_name} | TTFT p90 ms "
        "| TPOT p50 ms | prefill to longest match | decode to longest match "
        "| decode blocks read |"
    )
    lines = [head, "|" + " --- |" * 13]

    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:.0%}"

    for policy, s in summaries.items():
        computed = s["prefix"]["computed_prompt_tokens"]
        ttft = s["ttft_ms"]["p50"]
        kv = s.get("router_kv", {})
        lines.append(
            f"| {policy} | {s['completed']}/{s['num_requests']} | {s['prefix']['prompt_tokens']} "
            f"| {computed} | {s['prefill_node_tokens_computed']} "
            f"| {computed / max(base['prefix']['computed_prompt_tokens'], 1):.2f} "
            f"| {ttft:.0f} | {base['ttft_ms']['p50'] / ttft:.2f}x | {s['ttft_ms']['p90']:.0f} "
            f"| {s['tpot_ms']['p50']:.0f} | {share(longest_share(kv, 'prefill'))} "
            f"| {share(longest_share(kv, 'decode'))} | {s.get('decode_imported_blocks', '-')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.policy_sweep", description=__doc__, allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    a, shape = parser.add_argument, Multiturn()
    a("--policies", default=",".join(POLICIES), help="comma-separated, the first is the base")
    a("--rounds", type=int, default=1, help="runs per policy, the policies interleaved")
    a("--prefill", type=int, default=2)
    a("--decode", type=int, default=2)
    a("--threads-per-node", type=int, default=1)
    a("--up-args", nargs=argparse.REMAINDER, default=[], help="more `splitserve up` flags")
    a("--users", type=int, default=shape.users)
    a("--turns", type=int, default=shape.turns)
    a("--system-tokens", type=int, default=shape.system)
    a("--think-time", type=float, default=shape.think_s)
    a("--question-tokens", type=parse_lengths, default=shape.question, help="LOW:HIGH[:lognormal]")
    a("--answer-tokens", type=parse_lengths, default=shape.answer, help="LOW:HIGH[:lognormal]")
    a("--rate", type=float, default=0.5, help="conversations started per second")
    a("--seed", type=int, default=0)
    a("--timeout", type=float, default=300.0)
    a("--out", type=Path, default=RESULTS_DIR / "policy_sweep.json")
    args = parser.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    if any(p not in POLICIES for p in policies) or args.rounds < 1:
        parser.error(f"--policies takes {', '.join(POLICIES)}; --rounds must be >= 1")
    runs = []
    with tempfile.TemporaryDirectory(prefix="policy-sweep-") as tmp:
        for round_no in range(args.rounds):
            for policy in policies:
                print(f"== round {round_no + 1} policy {policy}", flush=True)
                runs.append(run_policy(policy, args, Path(tmp) / f"{round_no}-{policy}"))
    summaries = aggregate(runs)
    print(table(summaries))
    bound = fewest_computed(_config(args, "", "").multiturn or Multiturn(), args.seed, args.prefill)
    print(f"a perfect router computes {bound} prompt tokens per round (no eviction)")
    config = {k: v for k, v in vars(args).items() if k != "out"}
    config["question_tokens"] = format_lengths(args.question_tokens)
    config["answer_tokens"] = format_lengths(args.answer_tokens)
    out = write_json(args.out, {"bench": "policy_sweep", "config": config,
                                "fewest_computed_per_round": bound,
                                "summaries": summaries, "runs": runs})  # fmt: skip
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
