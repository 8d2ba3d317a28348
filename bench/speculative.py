"""Speculative decoding against plain decoding, same run: decode throughput and acceptance.

    python -m bench.offline --speculative-method ngram [--num-speculative-tokens 4]
                            [--draft-model DIR] [--batch-sizes 1,8] [--new-tokens 128]
                            [--rounds 3] [--device cuda --dtype bfloat16]
                            [--random-model NAME]

Two workloads, greedy: `repeat`, chat prompts whose answer repeats their input (repeat,
correct, extract from, or reformat a given passage: the case prompt lookup is for), and
`random`, seeded random token prompts. For each workload and batch size B the engine serves
B * rounds requests with B slots (continuous batching: a request that ends is replaced by the
next waiting one), without speculation and with it, in the order plain, speculative,
speculative, plain; each keeps its faster run. Decode throughput at batch B is the tokens
emitted by the steps in which exactly B requests decode and none prefills, over those steps'
time: the batch size the row names, with the (identical) prefill and the batch's draining
tail left out. The whole run's output tokens per second are reported beside it. Greedy outputs
of every run are checked to be the same. `--device` and `--dtype` apply to both arms; on a GPU
whose model is too large to carry, `--random-model` gives seeded random weights of a real
shape: the step costs are real, the acceptance is whatever such a model's loops give.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

PASSAGES = [
    "The harbour town wakes up early. Fishing boats leave before sunrise, and by seven the "
    "market on the quay is full of crates of mackerel, crabs and mussels. The baker on the "
    "corner sells bread to the fishermen when they come back, and the cafe next to him opens "
    "its shutters at eight. Tourists arrive with the ferry at ten, walk along the old wall, "
    "and most of them leave again on the afternoon boat.",
    "To reset the router, unplug it from the wall and wait thirty seconds. Plug it back in "
    "and wait until the power light turns green. Then press the reset button on the back for "
    "ten seconds with a paperclip. The lights will blink, and the router restarts with its "
    "factory settings. Connect to the network named on the sticker under the router, using "
    "the password printed below the name.",
    "Maria ordered three notebooks, two blue pens and a stapler on Monday. The notebooks "
    "arrived on Wednesday, but the pens were missing and the stapler was the wrong colour. "
    "She wrote to the shop on Thursday. The shop apologised, sent the pens by express post "
    "and offered a discount of ten percent on her next order, which she used in March to "
    "buy a desk lamp and a box of paper clips.",
    "The library opens at nine on weekdays and at ten on Saturdays; it is closed on Sundays. "
    "Members can borrow up to six books for three weeks and renew them twice online. Late "
    "returns cost twenty cents a day. The reading room on the first floor has free wifi, and "
    "the children's corner holds a story hour every Wednesday afternoon at four.",
    "Our team meets every Tuesday at half past nine in room 204. Anna presents the sales "
    "figures, Tom reports on the new warehouse in Leeds, and Priya collects questions for the "
    "board. The meeting ends at eleven. Minutes are sent by email on the same day, and any "
    "action items must be finished before the next meeting.",
    "For the soup, chop two onions and three carrots, and fry them in butter for five "
    "minutes. Add a litre of vegetable stock, a bay leaf and a handful of red lentils. Let it "
    "simmer for twenty minutes, take out the bay leaf, and blend until smooth. Season with "
    "salt, pepper and a little lemon juice, and serve it with warm bread.",
]
TASKS = [
    "Repeat the following text exactly, word for word:\n\n{}",
    "Correct any mistakes in the following text and return the full text:\n\n{}",
    "Copy the following text, then add one sentence at the end:\n\n{}",
    "Rewrite the following text with each sentence on its own line:\n\n{}",
]


def repeat_prompts(model_dir: Path, n: int) -> list[list[int]]:
    from models.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(model_dir)
    prompts = []
    for i in range(n):
        text = TASKS[i % len(TASKS)].format(PASSAGES[(i // len(TASKS) + i) % len(PASSAGES)])
        prompts.append(tokenizer.apply_chat_template([{"role": "user", "content": text}]))
    return prompts


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab) for _ in range(length)] for _ in range(n)]


def run(
    model_dir: Path,
    prompts: list[list[int]],
    new_tokens: int,
    ignore_eos: bool,
    concurrency: int,
    device: str = "cpu",
    dtype: str = "float32",
    **options: Any,
) -> dict[str, Any]:
    """One engine run over the prompts with `concurrency` slots; decode throughput at full
    batch, whole-run throughput and speculative totals. options: EngineConfig fields."""
    from engine.config import engine_config
    from engine.engine import LLMEngine
    from models.sampling_params import SamplingParams

    max_len = max(len(p) for p in prompts) + new_tokens + 16
    config = engine_config(
        model_dir,
        device=device,
        dtype=dtype,
        num_kv_blocks=concurrency * (-(-max_len // 16)) + 16,
        max_num_seqs=concurrency,
        **options,
    )
    engine = LLMEngine(config)
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=ignore_eos)
    for i, p in enumerate(prompts):
        engine.add_request(f"spec-{i}", p, params)
    tokens: dict[str, list[int]] = {f"spec-{i}": [] for i in range(len(prompts))}
    full = {"seconds": 0.0, "tokens": 0, "steps": 0}
    start = time.perf_counter()
    while engine.has_unfinished():
        emitted = engine.counters.spec_emitted
        before = engine.last_schedule
        began = time.perf_counter()
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
        seconds = time.perf_counter() - began
        plan = engine.last_schedule
        if plan is None or plan is before:
            continue
        # a step at full batch: every slot decodes (plainly, or as a chunk of guesses).
        # Without speculation a decode emits one token (counted at launch: with overlapped
        # scheduling its tokens come back in the next call); with it the step is finished
        # in this call and the speculative chunks' tokens are counted by the engine.
        if plan.prefills and not all(c.num_draft for c in plan.prefills):
            continue
        if len(plan.decodes) + len(plan.prefills) != concurrency:
            continue
        full["seconds"] += seconds
        full["steps"] += 1
        full["tokens"] += len(plan.decodes) + engine.counters.spec_emitted - emitted
    end = time.perf_counter()
    stats = engine.speculative_stats
    total = sum(map(len, tokens.values()))
    return {
        "seconds": end - start,
        "output_tok_s": total / (end - start),
        "full_batch_steps": full["steps"],
        "decode_tokens": full["tokens"],
        "decode_tok_s": full["tokens"] / max(full["seconds"], 1e-9),
        "steps": engine.counters.steps,
        "proposed": stats.proposed if stats else 0,
        "accepted": stats.accepted if stats else 0,
        "acceptance_rate": stats.acceptance_rate if stats else 0.0,
        "tokens": [tokens[f"spec-{i}"] for i in range(len(prompts))],
    }


def compare(
    model_dir: Path,
    workload: str,
    batch: int,
    new_tokens: int,
    spec_options: dict[str, Any],
    seed: int,
    vocab: int,
    rounds: int = 3,
    engine: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Plain, speculative, speculative, plain on one workload; the faster run of each.
    engine: options of both arms (device, dtype, EngineConfig fields)."""
    n = batch * rounds
    if workload == "repeat":
        prompts, ignore_eos = repeat_prompts(model_dir, n), False
    else:
        prompts, ignore_eos = random_prompts(n, 128, vocab, seed), True
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "speculative": []}
    for name in ("plain", "speculative", "speculative", "plain"):
        options = (engine or {}) | (spec_options if name == "speculative" else {})
        runs[name].append(run(model_dir, prompts, new_tokens, ignore_eos, batch, **options))
    plain = max(runs["plain"], key=lambda r: r["decode_tok_s"])
    spec = max(runs["speculative"], key=lambda r: r["decode_tok_s"])
    same = all(r["tokens"] == plain["tokens"] for r in runs["plain"] + runs["speculative"])
    row = {
        "workload": workload,
        "batch": batch,
        "plain_decode_tok_s": plain["decode_tok_s"],
        "speculative_decode_tok_s": spec["decode_tok_s"],
        "speed_up": spec["decode_tok_s"] / plain["decode_tok_s"],
        "requests": n,
        "full_batch_steps": {
            "plain": plain["full_batch_steps"],
            "speculative": spec["full_batch_steps"],
        },
        "plain_output_tok_s": plain["output_tok_s"],
        "speculative_output_tok_s": spec["output_tok_s"],
        "output_speed_up": spec["output_tok_s"] / plain["output_tok_s"],
        "acceptance_rate": spec["acceptance_rate"],
        "proposed": spec["proposed"],
        "accepted": spec["accepted"],
        "decode_tokens": spec["decode_tokens"],
        "plain_steps": plain["steps"],
        "speculative_steps": spec["steps"],
        "greedy_outputs_identical": same,
        "runs_decode_tok_s": {k: [r["decode_tok_s"] for r in v] for k, v in runs.items()},
    }
    print(
        f"{workload:>7} batch {batch:>2}: plain {row['plain_decode_tok_s']:7.1f} tok/s  "
        f"speculative {row['speculative_decode_tok_s']:7.1f} tok/s  "
        f"speed-up {row['speed_up']:.2f}x  acceptance {row['acceptance_rate']:.2f}  "
        f"steps {row['plain_steps']} -> {row['speculative_steps']}  "
        f"whole run {row['output_speed_up']:.2f}x  identical {same}",
        flush=True,
    )
    return row


def speculative_main(
    args: Any, model_dir: Path, vocab: int, options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """bench.offline --speculative-method: every workload and batch size, on args.device in
    args.dtype; options: EngineConfig fields of both arms (a random model's load format)."""
    engine = {"device": args.device, "dtype": args.dtype} | (options or {})
    rounds = args.rounds
    spec_options: dict[str, Any] = {
        "speculative_method": args.speculative_method,
        "num_speculative_tokens": args.num_speculative_tokens,
    }
    if args.draft_model:
        spec_options["draft_model"] = Path(args.draft_model)
    batches = [int(b) for b in str(args.batch_sizes).split(",")]
    rows = [
        compare(
            model_dir, workload, b, args.new_tokens, spec_options, args.seed, vocab, rounds, engine
        )
        for workload in ("repeat", "random")
        for b in batches
    ]
    draft = Path(args.draft_model).name if args.draft_model else None  # no local paths
    setup = spec_options | {"draft_model": draft, "rounds": rounds} | engine
    return {"speculative": setup, "results": rows}
