"""What every benchmark shares: same-run hardware limits, JSON output, model FLOP counts."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

RESULTS_DIR = Path("bench/results")


PEAK_SECONDS = 2.0  # how long each peak measurement runs (the bench tests shorten it)


def matmul_peak_gflops(
    dtype: torch.dtype = torch.float32,
    n: int = 2048,
    seconds: float | None = None,
    device: str = "cpu",
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Best achieved GFLOP/s of a square matmul: the compute limit of this run. With ``clock``
    ``time.process_time`` (CPU): per CPU-second of the process's threads, which time slices
    given to other work on a shared machine do not lower."""
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    for _ in range(2):
        a @ b
    best = 0.0
    deadline = time.perf_counter() + (PEAK_SECONDS if seconds is None else seconds)
    while time.perf_counter() < deadline:
        _sync(device)
        t = clock()
        a @ b
        _sync(device)
        best = max(best, 2 * n**3 / max(clock() - t, 1e-9) / 1e9)
    return best


def memcpy_gbps(nbytes: int, repeats: int = 5, device: str = "cpu") -> float:
    """Best single-process copy bandwidth of `nbytes` (read + write counted once)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def triton_device() -> torch.device:
    """CUDA when there is a GPU; else the CPU with the Triton interpreter switched on (set
    before the kernels first import triton), where a benchmark's figures mean nothing."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    os.environ.setdefault("TRITON_INTERPRET", "1")
    return torch.device("cpu")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@dataclass(frozen=True)
class ModelShape:
    """The numbers a FLOP count needs, read from a HF config.json."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    mlp_params: int = 0  # active MLP weights per layer (mixture of experts: top-k experts)
    attn_params: int = 0  # attention weights per layer where not q/k/v/o of head_dim (MLA)
    pair_dim: int = 0  # q.k plus p.v dims per head and (query, key) pair; 0: 2 * head_dim

    @classmethod
    def from_dir(cls, model_dir: Path) -> ModelShape:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
        heads = cfg["num_attention_heads"]
        return cls(
            hidden=cfg["hidden_size"],
            intermediate=cfg["intermediate_size"],
            layers=cfg["num_hidden_layers"],
            heads=heads,
            kv_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            vocab=cfg["vocab_size"],
            mlp_params=_active_mlp_params(cfg),
            **_latent_attention(cfg),
        )

    @property
    def layer_params(self) -> int:
        """Weights of the linear layers of one decoder layer."""
        q_o = 2 * self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        attention = self.attn_params or q_o + kv
        return attention + (self.mlp_params or 3 * self.hidden * self.intermediate)

    def sequence_flops(self, prompt_len: int, new_tokens: int) -> float:
        """FLOPs to prefill `prompt_len` tokens and decode `new_tokens` (the first from prefill).

        Linear layers: 2 per weight per token; attention: 4 * heads * head_dim per
        (query, key) pair; lm_head only on the positions that are sampled.
        """
        computed = prompt_len + new_tokens - 1  # the last sampled token is never fed back
        linear = 2 * self.layers * self.layer_params * computed
        pairs = sum(p + 1 for p in range(computed))  # causal (query, key) pairs
        attention = 2 * self.layers * self.heads * (self.pair_dim or 2 * self.head_dim) * pairs
        lm_head = 2 * self.hidden * self.vocab * new_tokens
        return float(linear + attention + lm_head)


def _latent_attention(cfg: dict[str, Any]) -> dict[str, int]:
    """MLA's weights per layer and per-pair dims (prefill's expanded form), or nothing."""
    if not cfg.get("kv_lora_rank"):
        return {}
    hidden, heads, lora = cfg["hidden_size"], cfg["num_attention_heads"], cfg["kv_lora_rank"]
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    q_lora = cfg.get("q_lora_rank") or 0
    q = hidden * q_lora + q_lora * heads * qk if q_lora else hidden * heads * qk
    kv = hidden * (lora + cfg["qk_rope_head_dim"]) + lora * heads * (qk - cfg["qk_rope_head_dim"])
    vo = lora * heads * cfg["v_head_dim"] + heads * cfg["v_head_dim"] * hidden
    return {"attn_params": q + kv + vo, "pair_dim": qk + cfg["v_head_dim"]}


def _active_mlp_params(cfg: dict[str, Any]) -> int:
    """MLP weights one token reads per layer, averaged over the layers: the router and the
    top-k experts (and a shared expert) on the sparse layers, the dense MLP on the others."""
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    dense = 3 * hidden * cfg["intermediate_size"]
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
    experts = experts or cfg.get("n_routed_experts") or 0
    if not experts:
        return dense
    expert_inter = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    sparse = hidden * experts + 3 * hidden * expert_inter * cfg["num_experts_per_tok"]
    shared = cfg.get("shared_expert_intermediate_size") or 0
    shared = shared or (cfg.get("n_shared_experts") or 0) * expert_inter  # DeepSeek's
    sparse += 3 * hidden * shared
    step = cfg.get("decoder_sparse_step") or 1
    first_dense = range(cfg.get("first_k_dense_replace") or 0)
    dense_layers = set(cfg.get("mlp_only_layers") or []) | set(first_dense)
    n_sparse = sum(1 for i in range(layers) if i not in dense_layers and (i + 1) % step == 0)
    return (n_sparse * sparse + (layers - n_sparse) * dense) // layers


def environment() -> dict[str, Any]:
    """What a figure was measured on: every benchmark's JSON carries it."""
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        **cpu_identity(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


_ISA = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def cpu_identity() -> dict[str, Any]:
    """The CPU's model, its vector extensions that the kernels can use, and the vector width
    the C kernels were built for (None without them)."""
    from engine import cpu_kernels

    model, flags = "", set()
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        first = ""
    for line in first.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            model = value.strip()
        elif key.strip() in ("flags", "Features"):
            flags = set(value.split())
    width = cpu_kernels.vec_width() if cpu_kernels.available() else None
    return {"cpu": model, "cpu_isa": [f for f in _ISA if f in flags], "cpu_vec_width": width}


def write_json(path: Path, payload: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
