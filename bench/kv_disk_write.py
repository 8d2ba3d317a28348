"""The disk KV tier's write rate against a plain write of the same bytes, same run, and
against the rate a prefill makes blocks.

    python -m bench.kv_disk_write --blocks 256 --layers 30 --prompt-tokens 2048

Three timings in one directory (--dir; default: a temporary one):
- raw: the block files' bytes written with plain open / write, one file per block: the limit;
- tier: as many blocks written by the disk tier's copier (engine.kv.copier, engine.kv.
  disk_store: header, CRC-32, a temporary name, then a rename), from submit until its file
  lane is done; raw and tier alternate --repeats times, the best of each counts;
- burst: one prompt prefilled by an engine with host and disk tiers, on a random-weight model
  of the shape; its blocks leave the device at once. It counts the writes dropped (0 while
  the disk keeps up) and compares the tier's block rate with the prefill's.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import RESULTS_DIR, environment, write_json
from bench.random_model import SHAPES, write_random_model_dir
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.kv.cache import KVLayout, allocate_kv_cache
from engine.kv.copier import TierCopier
from engine.kv.disk_store import DiskStore
from engine.kv.tier_book import CopyKind, CopyOrder
from engine.kv.tier_index import TierEntry
from models.block_hash import block_hash
from models.sampling_params import SamplingParams

BLOCK_SIZE = 16


def layout_of(args: argparse.Namespace) -> KVLayout:
    shape = SHAPES[args.shape]
    head_dim = shape.get("head_dim", shape["hidden_size"] // shape["num_attention_heads"])
    return KVLayout(
        "bench", args.dtype, BLOCK_SIZE, args.layers, shape["num_key_value_heads"], head_dim
    )


def raw_write(directory: Path, blocks: int, file_bytes: int) -> float:
    """Seconds to write `blocks` files of `file_bytes` random bytes with plain writes."""
    directory.mkdir(parents=True, exist_ok=True)
    data = os.urandom(file_bytes)
    start = time.perf_counter()
    for i in range(blocks):
        with open(directory / f"{i:08d}.raw", "wb") as f:
            f.write(data)
    return time.perf_counter() - start


def tier_write(disk: DiskStore, blocks: int) -> float:
    """Seconds for the tier's copier to write `blocks` host blocks to disk."""
    layout = disk.layout
    device = allocate_kv_cache(layout, 1, torch.device("cpu"))
    copier = TierCopier(device, layout, blocks, disk)
    copier.host.uniform_(-1.0, 1.0)
    orders = []
    for i in range(blocks):
        tokens = tuple(range(i * BLOCK_SIZE, (i + 1) * BLOCK_SIZE))
        entry = TierEntry(block_hash(None, tokens), None, tokens, i)
        orders.append(CopyOrder(CopyKind.HOST_TO_DISK, slot=i, entry=entry))
    start = time.perf_counter()
    copier.submit(orders, [])
    copier.flush()
    seconds = time.perf_counter() - start
    copier.close()
    return seconds


def burst(directory: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One long prompt's prefill, then its blocks written behind: rates and drops."""
    layers = {"num_hidden_layers": args.layers}
    model_dir = write_random_model_dir(args.shape, directory / "model", **layers)
    config = EngineConfig(
        model_dir=model_dir, load_format="random", dtype=args.dtype, block_size=BLOCK_SIZE,
        num_kv_blocks=args.prompt_tokens // BLOCK_SIZE + 8,
        max_num_batched_tokens=args.prompt_tokens, kv_offload_cpu_gb=args.cpu_gb,
        kv_offload_disk_path=directory / "kv", kv_offload_disk_gb=args.disk_gb,
    )  # fmt: skip
    engine = LLMEngine(config)
    assert engine.kv_tiers is not None
    vocab = SHAPES[args.shape]["vocab_size"]
    prompt = [(17 * i) % (vocab - 3) + 3 for i in range(args.prompt_tokens)]
    once = SamplingParams(max_tokens=1, ignore_eos=True)
    engine.add_request("warm-up", prompt[: BLOCK_SIZE - 1], once)  # no full block: no write
    while engine.has_unfinished():
        engine.step()
    engine.add_request("burst", prompt, once)
    start = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    engine.sync_tiers()  # what an idle engine loop does: the burst goes to the copier
    engine.kv_tiers.copier.flush()
    write_s = time.perf_counter() - start
    engine.close()
    tiers = engine.counters.kv_tiers
    blocks = args.prompt_tokens // BLOCK_SIZE
    return {
        "blocks": blocks,
        "prefill_s": prefill_s,
        "write_s": write_s,
        "prefill_blocks_per_s": blocks / prefill_s,
        "disk_blocks_per_s": blocks / write_s,
        "disk_stores": tiers["disk_stores"],
        "disk_dropped": tiers["disk_dropped"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2", help="model shape")
    parser.add_argument("--layers", type=int, default=30, help="layers of that shape")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--blocks", type=int, default=256, help="blocks of the write timings")
    parser.add_argument("--repeats", type=int, default=3, help="of the write timings")
    parser.add_argument("--prompt-tokens", type=int, default=2048, help="the burst's prompt")
    parser.add_argument("--cpu-gb", type=float, default=1.0, help="host tier GiB (burst)")
    parser.add_argument("--disk-gb", type=float, default=1.0, help="disk tier GiB (burst)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (the disk)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "kv_disk_write.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kv-disk-", dir=args.dir) as tmp:
        raw_s = tier_s = float("inf")
        for i in range(args.repeats):
            disk = DiskStore(Path(tmp) / f"tier{i}", layout_of(args))
            file_bytes = disk.file_bytes(BLOCK_SIZE)
            raw_s = min(raw_s, raw_write(Path(tmp) / f"raw{i}", args.blocks, file_bytes))
            tier_s = min(tier_s, tier_write(disk, args.blocks))
        engine = burst(Path(tmp), args)
    total = args.blocks * file_bytes
    result = {
        "workload": {k: str(v) for k, v in vars(args).items()},
        "environment": environment(),
        "file_bytes": file_bytes,
        "raw_gbps": total / raw_s / 1e9,
        "tier_gbps": total / tier_s / 1e9,
        "tier_to_raw": raw_s / tier_s,
        "burst": engine,
        "headroom": engine["disk_blocks_per_s"] / engine["prefill_blocks_per_s"],
    }
    write_json(args.out, result)
    print(
        f"{args.blocks} block files of {file_bytes / 1e6:.2f} MB: tier "
        f"{result['tier_gbps']:.2f} GB/s, plain writes {result['raw_gbps']:.2f} GB/s "
        f"({result['tier_to_raw']:.2f}x of the plain rate)"
    )
    print(
        f"burst of {engine['blocks']} blocks from a {args.prompt_tokens}-token prefill: "
        f"{engine['disk_stores']:.0f} written, {engine['disk_dropped']:.0f} dropped; the disk "
        f"tier writes {engine['disk_blocks_per_s']:.0f} blocks/s, the prefill makes "
        f"{engine['prefill_blocks_per_s']:.0f} ({result['headroom']:.1f}x headroom); "
        f"wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
