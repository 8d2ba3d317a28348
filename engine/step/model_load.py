"""Loading a runner's model: the weights (a checkpoint, or random ones), this rank's shard
and pipeline stage, and the quantization the engine runs them in."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from dataclasses import dataclass

import torch

from engine import cpu_kernels
from engine.config import EngineConfig
from engine.kv.cache import KVLayout
from engine.model.attention import AttentionBackend
from engine.model.backends import select_attention
from engine.model.config import ModelConfig
from engine.model.decoder import DecoderModel
from engine.model.loader import init_random_weights, load_weights
from engine.model.quant import resolve_quantization
from engine.model.shard import Shard, shard_config
from engine.model.stage import Stage, stage_config
from engine.phases import phase
from models.weights import has_safetensors

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    """A model's weights on the device and its cache layout, before any KV cache: loaded
    apart from ModelRunner where another cache must be planned after it (the draft model)."""

    model_config: ModelConfig
    model: DecoderModel
    max_model_len: int
    layout: KVLayout
    packed_weights: bool


def load_model(
    config: EngineConfig,
    model_config: ModelConfig,
    attention: AttentionBackend | None = None,
    shard: Shard | None = None,
    stage: Stage | None = None,
) -> LoadedModel:
    """Build the model on ``config.device``, load (or draw) its weights, pack them for the
    CPU kernels where asked; with a tensor-parallel ``shard``, that rank's part of them and
    the layout of its part of the KV cache; with a pipeline ``stage``, its layers' only."""
    device = torch.device(config.device)
    if device.type == "cpu":
        retain_freed_host_memory()
        if config.cpu_kernels and config.torch_dtype == torch.float32:
            with phase("kernels"):  # compiled at a first start, then cached
                cpu_kernels.available()
    with phase("weights"):
        return _load_weights(config, model_config, device, attention, shard, stage)


def _load_weights(
    config: EngineConfig,
    model_config: ModelConfig,
    device: torch.device,
    attention: AttentionBackend | None,
    shard: Shard | None,
    stage: Stage | None,
) -> LoadedModel:
    max_model_len = min(
        config.max_model_len or model_config.max_position_embeddings,
        model_config.max_position_embeddings,
    )
    model = DecoderModel(
        model_config,
        attention
        or select_attention(
            config.attention_backend, device, config.cpu_kernels, config.kv_cache_dtype
        ),
        max_model_len,
        config.torch_dtype,
        device,
        shard,
        stage,
    )
    if config.load_format == "random":
        init_random_weights(model)
    else:
        load_weights(model, config.model_dir, engine_quantization(config))
    packed = config.pack_cpu_weights and model.pack_cpu_weights()
    model.use_cpu_kernels(config.cpu_kernels)
    if config.float32_matmul_precision == "medium":
        taken = model.use_bf16_products(True)
        log.info("float32_matmul_precision medium: %d packed weights take bf16 products", taken)
    if config.int8_activations:
        taken = model.use_int8_activations(True)
        log.info("int8_activations: %d packed weights take integer dots", taken)
    local = stage_config(shard_config(model_config, shard or Shard()), model.stage)
    layout = KVLayout.for_model(local, config.torch_dtype, config.block_size, config.kv_cache_dtype)
    return LoadedModel(model_config, model, max_model_len, layout, packed)


def engine_quantization(config: EngineConfig) -> str:
    """The quantization the engine loads with (``auto`` resolved). Quantized weights are not
    sharded across ranks yet (but gpt-oss's MXFP4 experts, read per rank like any expert):
    with tensor parallelism ``auto`` keeps a GGUF directory's fp32 conversion, and a
    quantized checkpoint (a GGUF alone too) is refused, naming both settings."""
    fp32 = config.torch_dtype == torch.float32
    random = config.load_format == "random"
    method = resolve_quantization(
        config.quantization, config.model_dir, config.device, fp32, not random
    )
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    if tp * pp > 1 and method not in ("none", "mxfp4"):
        converted = has_safetensors(config.model_dir)
        if config.quantization == "auto" and method == "gguf" and converted:
            return "none"
        alone = "" if converted else f" ({config.model_dir} has no safetensors weights)"
        raise ValueError(
            f"quantization {method!r} with tensor_parallel_size {tp} and "
            f"pipeline_parallel_size {pp}: quantized weights are not sharded across ranks "
            f"yet{alone}"
        )
    return method


_M_TRIM_THRESHOLD = -1  # glibc mallopt parameters
_M_MMAP_THRESHOLD = -3


def retain_freed_host_memory() -> bool:
    """Keep freed activation-sized buffers in the glibc heap for reuse (process-wide).

    By default glibc maps large blocks fresh and returns them to the OS on free, so every
    step page-faults its activations back in: measured at 12-18% of a CPU prefill step and
    half of a decode step. Up to 32 MiB blocks stay in the heap, up to 1 GiB of it is
    retained. Returns False where this is not glibc.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, 32 << 20) == 1  # glibc's ceiling for this setting
    return ok and mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1
