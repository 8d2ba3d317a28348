"""How far a KV cache format moves the attention scores: RMS error of q.k / sqrt(d) against
float32, over the prefill of chat prompts on the default model (or ``--model DIR``).

    python -m bench.kv_quant_error [--model DIR] [--layer-stride 1] [--prompts 12]

The engine runs the prompts with a float32 cache and the torch ops; each layer's rotated
queries and keys are recorded, then each scheme rounds the keys and the error of every causal
(query, key) score of every head is measured. Schemes: bf16 keys; int8 rows (engine.kv_format.rows:
codes, a bf16 scale and mid per half row) of the keys as they are and Hadamard-rotated (as
the cache stores them, queries rotated alike); the cache's fp8 rows; and int8 rows of keys
divided by a per-channel table ``s`` (queries multiplied by it: exact in real arithmetic):

- ``pairs, W_k``: weight-only, ``s`` from the row norms of ``W_k * input_norm``, the two
  channels of each RoPE pair (i, i + d/2) given their max, so that ``s`` commutes with RoPE
  and can be applied before the fused rotary + KV-write kernels;
- ``pairs, calib``: the same constraint, ``s`` from the recorded keys' absmax (in-sample);
- ``free, calib + offset``: no pair constraint (``s`` applied after RoPE) and the recorded
  keys' mean subtracted (softmax-invariant without soft-capping), ``s = sqrt(std(k) /
  rms(q))``: in-sample, an upper bound on what a per-channel table gives in this row format.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch

from bench.oracle_prompts import PROMPTS as ORACLE_PROMPTS
from engine.kv_format.rows import dequantize_rows, quantize_rows, rotate_heads_

PROMPTS = ORACLE_PROMPTS[:12]  # the int8 KV oracle test's 12

Record = dict[int, list[tuple[torch.Tensor, torch.Tensor]]]  # layer -> [(q, k)] per prompt


def record(model_dir: Path, prompts: list[str]) -> tuple[Record, list[torch.Tensor], int]:
    """Each layer's rotated q [tokens, heads, d] and k [tokens, kv_heads, d] per prompt's
    prefill; each layer's ``W_k * input_norm`` [kv_heads * d, hidden]; the GQA group size."""
    from engine.llm import LLM
    from engine.model import layer_ops
    from models.sampling_params import SamplingParams

    rec: Record = {}
    original = layer_ops.TorchOps.rope_write_kv

    def hook(self: layer_ops.TorchOps, qkv, heads, kv_heads, kv_cache, layer, meta):  # type: ignore[no-untyped-def]
        out = original(self, qkv, heads, kv_heads, kv_cache, layer, meta)
        rec.setdefault(layer, []).append((out.q.clone(), out.k.clone()))
        return out

    layer_ops.TorchOps.rope_write_kv = hook  # type: ignore[method-assign]
    try:
        llm = LLM(model_dir, num_kv_blocks=256, cpu_kernels=False, enable_prefix_caching=False)
        for p in prompts:
            ids = llm.tokenizer.apply_chat_template([{"role": "user", "content": p}])
            llm.generate([ids], SamplingParams(max_tokens=1, temperature=0.0))
    finally:
        layer_ops.TorchOps.rope_write_kv = original  # type: ignore[method-assign]
    wks = []
    for layer in llm.engine.runner.model.decoder_layers():
        a = layer.attn
        packed = a.packed.get("qkv")
        w = packed.dequantize() if a.qkv.is_meta and packed is not None else a.qkv
        wks.append(w[a.q_size : a.q_size + a.kv_size].float() * layer.input_norm.float())
    first = layer.attn
    return rec, wks, first.num_heads // first.num_kv_heads


def _pair_max(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    m = torch.maximum(x[..., :half], x[..., half:])
    return torch.cat([m, m], dim=-1)


def _normed(s: torch.Tensor) -> torch.Tensor:
    return s / s.mean(-1, keepdim=True)


Scheme = Callable[[int, torch.Tensor], torch.Tensor]  # (layer, k) -> rounded k


def schemes(rec: Record, wks: list[torch.Tensor], group: int) -> dict[str, Scheme]:
    def rows(kind: str) -> Scheme:
        return lambda _, k: dequantize_rows(quantize_rows(k, kind), torch.float32)

    def scaled(table: dict[int, torch.Tensor], offset: dict[int, torch.Tensor]) -> Scheme:
        def apply(layer: int, k: torch.Tensor) -> torch.Tensor:
            s, mu = table[layer], offset.get(layer, torch.zeros(()))
            return dequantize_rows(quantize_rows((k - mu) / s, "int8"), torch.float32) * s + mu

        return apply

    def rotated(_: int, k: torch.Tensor) -> torch.Tensor:  # H undoes itself
        stored = quantize_rows(rotate_heads_(k.clone()), "int8")
        return rotate_heads_(dequantize_rows(stored, torch.float32))

    kv_heads = next(iter(rec.values()))[0][1].shape[1]
    keys = {i: torch.cat([k for _, k in r]) for i, r in rec.items()}  # [tokens, kv_heads, d]
    q_rms = {
        i: torch.cat([q for q, _ in r]).unflatten(1, (kv_heads, group)).pow(2).mean((0, 2)).sqrt()
        for i, r in rec.items()
    }
    weight = {i: _normed(_pair_max(wks[i].norm(dim=1).view(kv_heads, -1))) for i in rec}
    calib = {i: _normed(_pair_max(k.abs().amax(0))) for i, k in keys.items()}
    mean = {i: k.mean(0) for i, k in keys.items()}
    free = {i: _normed(((k - mean[i]).std(0) / q_rms[i]).sqrt()) for i, k in keys.items()}
    return {
        "bf16": lambda _, k: k.bfloat16().float(),
        "int8 rows, keys as they are": rows("int8"),
        "int8 rows, keys rotated (the cache)": rotated,
        "fp8_e4m3 rows (the cache)": rows("fp8_e4m3"),
        "int8, pairs, W_k (weight-only)": scaled(weight, {}),
        "int8, pairs, calib (in-sample)": scaled(calib, {}),
        "int8, free, calib + offset (in-sample)": scaled(free, mean),
    }


def score_error(rec: Record, scheme: Scheme, group: int) -> float:
    """RMS over every causal (query, key) pair and head of (q.k_hat - q.k) / sqrt(d)."""
    total, count = 0.0, 0
    for layer, prompts in rec.items():
        for q, k in prompts:
            t, d = q.shape[0], q.shape[-1]
            qg = q.unflatten(1, (k.shape[1], group))  # [t, kv_heads, group, d]
            diff = torch.einsum("tkgd,ukd->kgtu", qg, scheme(layer, k) - k) * d**-0.5
            causal = torch.ones(t, t, dtype=torch.bool).tril()
            total += diff[..., causal].pow(2).sum().item()
            count += int(causal.sum()) * q.shape[1]
    return (total / count) ** 0.5


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="HF directory (default model)")
    parser.add_argument("--layer-stride", type=int, default=1, help="measure every n-th layer")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    args = parser.parse_args()
    if args.model is None:
        from models import ensure_model

        args.model = ensure_model("smollm2")
    torch.set_grad_enabled(False)
    rec, wks, group = record(args.model, PROMPTS[: args.prompts])
    rec = {i: r for i, r in rec.items() if i % args.layer_stride == 0}
    print(f"{'scheme':42s} RMS error of q.k/sqrt(d)")
    for name, scheme in schemes(rec, wks, group).items():
        print(f"{name:42s} {score_error(rec, scheme, group):.4f}", flush=True)


if __name__ == "__main__":
    main()
