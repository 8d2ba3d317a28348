"""A tiny random Llama written as a GGUF (gguf's writer, llama.cpp's names and q / k row
order), and the transformers model on the weights the GGUF holds (gguf's own dequantizer):
the oracle of the GGUF loader.

gguf's Python package quantizes Q4_0, Q4_1 and Q8_0 only; the K-quants (Q4_K, Q5_K, Q6_K)
are encoded here, plainly (per-group min / max, not llama.cpp's search), in the block layouts
ggml reads.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from transformers import LlamaConfig, LlamaForCausalLM

from tests.engine.tiny_llama import TINY

# K-quant shapes: every row a whole number of 256-weight super-blocks
GGUF_TINY: dict[str, Any] = TINY | {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    _, _, layer, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_NAMES[module]}.{kind}"


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's q / k row order (the inverse of the loader's)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    return (
        w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def save_tiny_gguf(
    path: Path,
    types: Callable[[str], T],
    seed: int = 0,
    drop: tuple[str, ...] = (),
    **overrides: Any,
) -> LlamaForCausalLM:
    """Write ``path``/config.json and ``path``/tiny.gguf (matrix ``name`` of type
    ``types(name)``, norms F32, the tensors ``drop`` left out); return transformers' model
    on the GGUF's weights."""
    torch.manual_seed(seed)
    config = LlamaConfig(**(GGUF_TINY | overrides))
    model = LlamaForCausalLM(config).eval()
    writer = gguf.GGUFWriter(path / "tiny.gguf", "llama")
    writer.add_block_count(config.num_hidden_layers)
    held = {}
    for name, p in model.state_dict().items():
        if name in drop or (name == "lm_head.weight" and config.tie_word_embeddings):
            continue
        w = p.float().numpy()
        if w.ndim == 1:
            w = 1.0 + 0.2 * np.random.default_rng(len(held)).standard_normal(w.shape)
            w = w.astype(np.float32)
            writer.add_tensor(gguf_name(name), w)
            held[name] = w
            continue
        heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}
        kind = next((h for k, h in heads.items() if k in name), None)
        w = w / w.std() / w.shape[-1] ** 0.5
        w = (w if kind is None else _permute(w, kind)).astype(np.float32)
        qtype = types(name)
        blocks = quantize(w, qtype)
        writer.add_tensor(gguf_name(name), blocks, raw_dtype=qtype)
        back = gguf.quants.dequantize(blocks, qtype).reshape(w.shape)
        held[name] = back if kind is None else _unpermute(back, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    config.save_pretrained(path)
    state = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in held.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight", *drop}  # tied or dropped
    return model


def quantize(w: np.ndarray, qtype: T) -> np.ndarray:
    """[rows, cols] fp32 -> [rows, bytes] blocks of ``qtype``."""
    encode = {T.Q4_K: _q4_k, T.Q5_K: _q5_k, T.Q6_K: _q6_k}.get(qtype)
    if encode is None:
        return gguf.quants.quantize(w, qtype)
    rows = w.shape[0]
    return encode(w.reshape(-1, 256)).reshape(rows, -1)


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _k_scales(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K super-blocks x [n, 256]: (12-byte scales and mins, codes [n, 256])."""
    sub = x.reshape(-1, 8, 32)
    lo = np.minimum(sub.min(-1), 0)
    scale = (sub.max(-1) - lo) / levels
    d, dmin = scale.max(-1, keepdims=True) / 63, -lo.min(-1, keepdims=True) / 63
    d = d.astype(np.float16).astype(np.float32)
    dmin = dmin.astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / np.where(d > 0, d, 1)), 1, 63).astype(np.uint8)
    m = np.clip(np.round(-lo / np.where(dmin > 0, dmin, 1)), 0, 63).astype(np.uint8)
    step = (d * sc)[..., None]
    q = np.round((sub + (dmin * m)[..., None]) / np.where(step > 0, step, 1))
    q = np.clip(q, 0, levels).astype(np.uint8).reshape(-1, 256)
    packed = np.concatenate(
        [
            (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6),
            (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6),
            (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4),
        ],
        axis=1,
    )
    return np.concatenate([_f16(d), _f16(dmin), packed], axis=1), q


def _nibble_pairs(q: np.ndarray) -> np.ndarray:
    """Codes [n, 256] (low 4 bits) -> 128 bytes: per 64, code t | code t + 32 << 4."""
    c = q.reshape(-1, 4, 2, 32) & 15
    return (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(-1, 128)


def _q4_k(x: np.ndarray) -> np.ndarray:
    head, q = _k_scales(x, 15)
    return np.concatenate([head, _nibble_pairs(q)], axis=1)


def _q5_k(x: np.ndarray) -> np.ndarray:
    head, q = _k_scales(x, 31)
    high = (q.reshape(-1, 8, 32) >> 4) << np.arange(8, dtype=np.uint8)[None, :, None]
    qh = np.bitwise_or.reduce(high, axis=1).astype(np.uint8)
    return np.concatenate([head, qh, _nibble_pairs(q)], axis=1)


def _q6_k(x: np.ndarray) -> np.ndarray:
    sub = x.reshape(-1, 16, 16)
    scale = np.abs(sub).max(-1) / 31
    d = (scale.max(-1, keepdims=True) / 127).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / np.where(d > 0, d, 1)), 1, 127).astype(np.int8)
    step = (d * sc)[..., None]
    q = (np.clip(np.round(sub / step), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)
    low = q & 15  # [n, half, 4, 32]: ql byte t of a half holds codes t and t + 64
    ql = (low[:, :, 0:2].reshape(-1, 2, 64) | (low[:, :, 2:4].reshape(-1, 2, 64) << 4)).reshape(
        -1, 128
    )
    high = (q >> 4) << np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]
    qh = np.bitwise_or.reduce(high, axis=2).reshape(-1, 64).astype(np.uint8)
    return np.concatenate([ql, qh, sc.view(np.uint8), _f16(d)], axis=1)
