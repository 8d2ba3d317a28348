"""Load an AWQ, GPTQ or FP8 safetensors checkpoint into ``DecoderModel``.

The checkpoint's ``quantization_config`` (config.json) names the method. Every linear module
the checkpoint stores quantized (``X.qweight``... for int4, an fp8 ``X.weight`` with its
scale) is read into its unpacked form (``int4_checkpoint``, ``fp8_checkpoint``); the parts of
one fused matrix (q, k, v; gate, up) are stacked and the matrix is kept packed:

- int4 on the CPU: ``QuantWeight`` (4-bit codes, a scale and a min per group: ``(q - z) s`` is
  ``q s + (-z s)`` exactly, both products being exact in fp32), read by ``quant_linear.c``;
  activation-ordered GPTQ weights gather their inputs first;
- int4 and fp8 on CUDA: the Triton w4a16 and fp8 GEMMs (``gpu_weight``);
- fp8 on the CPU: dequantized into the fp32 weight at load (no fp8 kernel on the CPU yet).

An image-text checkpoint (``Gemma3ForConditionalGeneration``) is read by its text model's
names; its vision tower and projector, quantized or not, are not read. Modules the checkpoint
keeps in full precision (embeddings, the LM head, ``lm_head`` in
``modules_to_not_convert``) load as they are, as do MoE experts, which are dequantized into
their fused fp32 tensors. Missing, unexpected or misshapen tensors raise ValueError naming the
file and the tensor.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from engine.model.checkpoint_files import IGNORED_SUFFIXES, checkpoint_files, text_model_name
from engine.model.decoder import DecoderModel
from engine.model.layers import Packed
from engine.model.quant import fp8_checkpoint, int4_checkpoint
from engine.model.quant.weight import QuantWeight, RowQuant

Owner = tuple[Packed, str]  # (module, attribute) of a matrix the kernels can read packed
Unpacked = int4_checkpoint.Int4Weight | fp8_checkpoint.Fp8Weight
_QUANT_SUFFIXES: tuple[str, ...] = (".qweight", ".qzeros", ".scales", ".g_idx", ".input_scale")
_QUANT_SUFFIXES += (".weight_scale", ".weight_scale_inv")


def quantization_config(model_dir: Path) -> dict[str, Any]:
    config = json.loads((model_dir / "config.json").read_text())
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        raise ValueError(f"{model_dir / 'config.json'}: no quantization_config object")
    return qc


def load_quantized(model: DecoderModel, model_dir: Path, method: str) -> None:
    """Fill ``model`` from the ``method`` (awq, gptq or fp8) checkpoint in ``model_dir``."""
    where = str(model_dir / "config.json")
    qc = quantization_config(model_dir)
    read: Callable[[Callable[[str], torch.Tensor | None], str], Unpacked]
    if method == "fp8":
        fp8 = fp8_checkpoint.parse_fp8_config(qc, where)
        read = lambda get, prefix: fp8_checkpoint.read_module(get, prefix, fp8)  # noqa: E731
        quantized = _fp8_modules
    else:
        int4 = int4_checkpoint.parse_int4_config(qc, where)
        if int4.method != method:
            raise ValueError(f"{where}: the checkpoint is {int4.method}, not {method}")
        read = lambda get, prefix: int4_checkpoint.read_module(get, prefix, int4)  # noqa: E731
        quantized = _int4_modules
    tensors = _Tensors(checkpoint_files(model_dir))
    modules = quantized(tensors)
    names = {n for n in tensors.names if not n.endswith(_QUANT_SUFFIXES)} | {
        f"{m}.weight" for m in modules
    }
    targets = model.weight_targets(names)
    owners = _owners(model)
    parts: dict[Owner, list[tuple[int, Unpacked]]] = defaultdict(list)
    used: set[str] = set()
    with torch.no_grad():
        for name, target in targets.items():
            prefix = name.removesuffix(".weight")
            if prefix in modules:
                w = read(tensors.get, prefix)
                used.update(n for n in tensors.names if n.startswith(prefix + "."))
                _check_shape(tensors.file_of(f"{prefix}.{modules[prefix]}"), name, w.shape, target)
                owner = owners.get(target.untyped_storage().data_ptr())
                if owner is None or not _packable(w, target.device):
                    target.copy_(w.dequantize())
                else:
                    parts[owner].append((_row_offset(target, owner), w))
            elif name in tensors.names:
                tensor = tensors.get(name)
                assert tensor is not None
                _check_shape(tensors.file_of(name), name, tuple(tensor.shape), target)
                if target.data_ptr() in _offset_norms(model):
                    tensor = tensor.float() + model.config.norm_offset
                target.copy_(tensor)
                used.add(name)
            else:
                raise ValueError(f"{model_dir}: checkpoint lacks tensor {name!r}")
    for name in sorted(tensors.names - used):
        if not _ignored(name, model):
            raise ValueError(f"{tensors.file_of(name)}: unexpected tensor {name!r}")
    for owner, pieces in parts.items():
        _install(owner, [w for _, w in sorted(pieces, key=lambda p: p[0])])


class _Tensors:
    """Random access to a checkpoint's tensors across its files, by the text model's names
    (an image-text checkpoint's ``language_model`` tensors as a causal LM's; its vision
    tower and projector left out: ``text_model_name``)."""

    def __init__(self, files: list[Path]) -> None:
        self._files: dict[str, tuple[Path, str]] = {}  # text name -> (file, name there)
        self._handles: dict[Path, Any] = {}
        for path in files:
            if not path.is_file():
                raise ValueError(f"{path}: safetensors file named by the index is missing")
            handle = safe_open(str(path), framework="pt")
            self._handles[path] = handle
            keys: list[str] = handle.keys()  # a safe_open handle is not iterable
            for key in keys:
                name = text_model_name(key)
                if name is not None:
                    self._files[name] = (path, key)
        self.names = set(self._files)

    def file_of(self, name: str) -> Path:
        return self._files[name][0] if name in self._files else next(iter(self._handles), Path("."))

    def get(self, name: str) -> torch.Tensor | None:
        if name not in self._files:
            return None
        path, key = self._files[name]
        return self._handles[path].get_tensor(key)


def _int4_modules(tensors: _Tensors) -> dict[str, str]:
    """Module prefix -> the tensor that names it, for every int4 module."""
    return {n.removesuffix(".qweight"): "qweight" for n in tensors.names if n.endswith(".qweight")}


def _fp8_modules(tensors: _Tensors) -> dict[str, str]:
    """Module prefix -> its weight, for every module stored in fp8 (it has a weight scale)."""
    found = {}
    for n in tensors.names:
        for suffix in (".weight_scale", ".weight_scale_inv"):
            if n.endswith(suffix) and f"{n.removesuffix(suffix)}.weight" in tensors.names:
                found[n.removesuffix(suffix)] = "weight"
    return found


def _check_shape(path: Path, name: str, shape: tuple[int, ...], target: torch.Tensor) -> None:
    if tuple(shape) != tuple(target.shape):
        raise ValueError(
            f"{path}: tensor {name!r} has shape {tuple(shape)}, expected {tuple(target.shape)}"
        )


def _offset_norms(model: DecoderModel) -> set[int]:
    return {t.data_ptr() for t in model.norm_weights()} if model.config.norm_offset else set()


def _ignored(name: str, model: DecoderModel) -> bool:
    if name.endswith(IGNORED_SUFFIXES) or name.endswith(".input_scale"):
        return True  # weight-only: activations are never quantized
    return name == "lm_head.weight" and model.config.tie_word_embeddings


def _owners(model: DecoderModel) -> dict[int, Owner]:
    found = [(m, a) for m in model.modules() if isinstance(m, Packed) for a in m.MATRICES]
    return {getattr(m, a).untyped_storage().data_ptr(): (m, a) for m, a in found}


def _row_offset(target: torch.Tensor, owner: Owner) -> int:
    param = getattr(*owner)
    return (target.storage_offset() - param.storage_offset()) // param.stride(0)


def _packable(w: Unpacked, device: torch.device) -> bool:
    if device.type == "cuda":
        return True
    return isinstance(w, int4_checkpoint.Int4Weight) and w.group_size % 16 == 0


def _install(owner: Owner, pieces: list[Unpacked]) -> None:
    """One matrix from its stacked parts, kept packed in the form its device computes with."""
    module, attr = owner
    param: nn.Parameter = getattr(module, attr)
    name = f"{type(module).__name__}.{attr}"
    packed: Any
    if isinstance(pieces[0], fp8_checkpoint.Fp8Weight):
        from engine.model.quant.gpu_weight import Fp8GpuWeight

        fused8 = fp8_checkpoint.cat_outputs(pieces, name)  # type: ignore[arg-type]
        packed = Fp8GpuWeight(fused8, param.device, param.dtype)
    else:
        fused = int4_checkpoint.cat_outputs(pieces, name)  # type: ignore[arg-type]
        if param.device.type == "cuda":
            from engine.model.quant.gpu_weight import Int4GpuWeight

            packed = Int4GpuWeight(fused, param.device, param.dtype)
        else:
            mins = -fused.zeros * fused.scales  # exact: small integers times halves
            rows = RowQuant(fused.codes, fused.scales, mins, 4, fused.group_size)
            packed = QuantWeight(rows, param.device, perm=fused.perm)
    module.packed[attr] = packed
    setattr(module, attr, nn.Parameter(torch.empty(param.shape, device="meta"), False))
