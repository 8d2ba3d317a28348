"""Load a GGUF checkpoint (llama.cpp's format) into ``DecoderModel``, quantized matrices kept
packed.

Tensor names are mapped to the Hugging Face names the layer objects take (``weight_targets``);
llama.cpp's converter permutes the q and k rows of Llama models for its rotary layout, undone
here as transformers' GGUF loader does. F32 / F16 tensors (norms, small matrices) load plain.
A matrix whose parts (q, k and v of the fused ``qkv``; gate and up) are all quantized becomes
one ``QuantWeight`` that the linear layers read through ``quant_linear.c``; its fp32
parameter is dropped (left on the meta device). The embedding's packed table serves both the
lookup and a tied LM head. Unknown tensors, types or shapes raise ValueError naming the file
and the tensor.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from engine.model.decoder import DecoderModel
from engine.model.layers import Packed
from engine.model.quant.gguf_blocks import BLOCKS, decode_blocks
from engine.model.quant.weight import QuantWeight, RowQuant, concat_rows
from models.gguf_header import read_gguf_header

ARCHITECTURES = ("llama",)  # the q / k row permutation is Llama's
_PLAIN = {"F32": np.float32, "F16": np.float16}
_GLOBAL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_IGNORED = ("rope_freqs.weight",)  # RoPE is recomputed from config.json
_BLOCK_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")

Owner = tuple[Any, str]  # (module, attribute) of a matrix


def hf_name(name: str) -> str | None:
    """The Hugging Face name of a llama.cpp tensor name, None if not one of the known."""
    if m := _BLOCK_NAME.match(name):
        part = _BLOCK.get(m[2])
        return None if part is None else f"model.layers.{m[1]}.{part}.{m[3]}"
    stem, _, kind = name.rpartition(".")
    return f"{_GLOBAL[stem]}.{kind}" if stem in _GLOBAL else None


def load_gguf(model: DecoderModel, path: Path) -> None:
    """Fill every weight of ``model`` from the GGUF file ``path``. The tensor table comes from
    ``read_gguf_header``, which skips the metadata's arrays (a tokenizer's vocabulary): the
    gguf package's reader parses them item by item, seconds for a 49k-token vocabulary."""
    header = read_gguf_header(path)  # a truncated or corrupt file: one line naming what is wrong
    _check_model(model, path, header.architecture)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    targets = model.weight_targets()
    owners = _owners(model)
    parts: dict[Owner, list[tuple[int, RowQuant]]] = defaultdict(list)
    filled: set[str] = set()
    with torch.no_grad():
        for t in header.tensors:
            if t.name in _IGNORED:
                continue
            name = hf_name(t.name)
            target = None if name is None else targets.get(name)
            if name is None or target is None:
                raise ValueError(f"{path}: unexpected tensor {t.name!r}")
            shape = tuple(reversed(t.dims))
            if shape != tuple(target.shape):
                raise ValueError(
                    f"{path}: tensor {t.name!r} has shape {shape}, expected {tuple(target.shape)}"
                )
            start = header.data_start + t.offset
            raw = data[start : start + t.nbytes]
            perm = _row_permutation(model, name, shape[0])
            kind = t.type_name
            if kind in _PLAIN:
                plain = torch.from_numpy(np.array(raw.view(_PLAIN[kind]), np.float32))
                plain = plain.reshape(shape)
                target.copy_(plain if perm is None else plain[perm])
            elif kind in BLOCKS and len(shape) == 2:
                rows = decode_blocks(kind, raw, *shape)
                rows = rows if perm is None else rows.rows(perm)
                owner = owners.get(target.untyped_storage().data_ptr())
                if owner is None:  # not a matrix the kernels read packed
                    target.copy_(rows.dequantize())
                else:
                    parts[owner].append((_row_offset(target, owner), rows))
            else:
                known = ", ".join((*_PLAIN, *BLOCKS))
                raise ValueError(f"{path}: tensor {t.name!r} has type {kind}, not one of {known}")
            filled.add(name)
    missing = sorted(set(targets) - filled)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"{path}: GGUF lacks tensor {missing[0]!r}{more}")
    for owner, pieces in parts.items():
        _install(model, owner, sorted(pieces, key=lambda p: p[0]))


def _check_model(model: DecoderModel, path: Path, arch: str) -> None:
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"{path}: GGUF architecture {arch!r} is not supported (supported: "
            f"{', '.join(ARCHITECTURES)})"
        )
    if model.config.moe is not None or model.config.naming == "phi3":
        raise ValueError(f"{path}: GGUF loading takes dense Llama-family models only")


def _owners(model: DecoderModel) -> dict[int, Owner]:
    """Storage address of each matrix that can be kept quantized -> (module, attribute)."""
    found: list[Owner] = [(model, "embed")]
    if not model.config.tie_word_embeddings:
        found.append((model, "lm_head"))
    for module in model.modules():
        if isinstance(module, Packed):
            found += [(module, name) for name in module.MATRICES]
    return {getattr(m, a).untyped_storage().data_ptr(): (m, a) for m, a in found}


def _row_offset(target: torch.Tensor, owner: Owner) -> int:
    param = getattr(*owner)
    return (target.storage_offset() - param.storage_offset()) // param.stride(0)


def _row_permutation(model: DecoderModel, name: str, rows: int) -> torch.Tensor | None:
    """Undo llama.cpp's q / k row order: per head, its two rotary halves were interleaved."""
    cfg = model.config
    if ".self_attn.q_proj." in name:
        heads = cfg.num_attention_heads
    elif ".self_attn.k_proj." in name:
        heads = cfg.num_key_value_heads
    else:
        return None
    half = rows // heads // 2
    return torch.arange(rows).view(heads, half, 2).transpose(1, 2).reshape(-1)


def _install(model: DecoderModel, owner: Owner, pieces: list[tuple[int, RowQuant]]) -> None:
    """The quantized rows of one matrix: packed if they cover it, else dequantized into it."""
    module, attr = owner
    param: nn.Parameter = getattr(module, attr)
    if sum(rows.shape[0] for _, rows in pieces) != param.shape[0]:  # some rows came plain
        for offset, rows in pieces:
            param.data[offset : offset + rows.shape[0]].copy_(rows.dequantize())
        return
    packed = QuantWeight(concat_rows([rows for _, rows in pieces]), param.device)
    empty = nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device="meta"), False)
    if isinstance(module, Packed):
        module.packed[attr] = packed
        setattr(module, attr, empty)
    elif attr == "embed":
        model.packed_embed = packed
        model.embed = empty
        if model.config.tie_word_embeddings:
            model.packed_lm_head, model.lm_head = packed, empty
    else:
        model.packed_lm_head, model.lm_head = packed, empty
