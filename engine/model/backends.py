"""Choosing a step's attention backend: the torch one (CPU, the oracle) or the Triton
kernels (CUDA, or interpreted)."""

from __future__ import annotations

import torch

from engine.model.attention import AttentionBackend, TritonAttention
from engine.model.torch_attention import TorchAttention


def select_attention(name: str, device: torch.device, cpu_kernel: bool = True) -> AttentionBackend:
    """``torch``, ``triton``, or ``auto``: Triton on CUDA when it is importable, else torch."""
    if name not in ("auto", "torch", "triton"):
        raise ValueError(f"attention backend must be auto, torch or triton, got {name!r}")
    if name == "torch" or (name == "auto" and device.type != "cuda"):
        return TorchAttention(cpu_kernel)
    from engine.triton_kernels import triton_available

    if triton_available():
        return TritonAttention()
    if name == "triton":
        raise ValueError(
            "attention_backend 'triton' needs triton and a CUDA device (or TRITON_INTERPRET=1)"
        )
    return TorchAttention(cpu_kernel)
