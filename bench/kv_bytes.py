"""KV bytes per token of a shape's cache layout, against the layouts its attention would
need without a latent: MLA's latent rows against every head's own K and V (what the heads
read once the latent is expanded) and a grouped-query cache of 8 KV heads.

    python -m bench.kv_bytes [--shape NAME (bench.random_model.SHAPES)] [--dtype bfloat16]
                             [--kv-cache-dtype auto|int8|fp8_e4m3] [--out PATH]

The figures are the engine's own layout arithmetic (``KVLayout.bytes_per_token``, the bytes
a block holds per token), so they are exact and the same on any machine.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from bench.random_model import SHAPES, write_random_model_dir
from engine.kv.cache import KVLayout
from engine.model.config import ModelConfig

GQA_KV_HEADS = 8


def layouts(config: ModelConfig, dtype: str, kv_dtype: str) -> dict[str, KVLayout]:
    """The shape's own layout and, for MLA, the per-head K / V layouts of its heads."""
    own = KVLayout.for_model(config, dtype, 16, kv_dtype)
    if config.mla is None:
        return {"own": own}
    heads, mla = config.num_attention_heads, config.mla
    # K of qk_head_dim and V of v_head_dim per head: one row of their mean width
    width = (mla.qk_head_dim + mla.v_head_dim) // 2
    mha = KVLayout(own.model, dtype, 16, own.num_layers, heads, width, kv_dtype=kv_dtype)
    gqa = KVLayout(own.model, dtype, 16, own.num_layers, GQA_KV_HEADS, width, kv_dtype=kv_dtype)
    return {"mla_latent": own, f"mha_{heads}_heads": mha, f"gqa_{GQA_KV_HEADS}_heads": gqa}


def report(shape: str, dtype: str, kv_dtype: str, directory: Path) -> dict[str, Any]:
    config = ModelConfig.from_dir(write_random_model_dir(shape, directory))
    found = layouts(config, dtype, kv_dtype)
    base = next(iter(found.values())).bytes_per_token
    rows = {
        name: {"bytes_per_token": layout.bytes_per_token, "x_latent": layout.bytes_per_token / base}
        for name, layout in found.items()
    }
    return {"shape": shape, "dtype": dtype, "kv_cache_dtype": kv_dtype, "layouts": rows}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="deepseek-v3")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "int8", "fp8_e4m3"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        result = report(args.shape, args.dtype, args.kv_cache_dtype, Path(tmp))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
