"""Engine configuration: one frozen dataclass, validated at construction."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import torch

from engine.kv_format.dtypes import check_kv_cache_dtype

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


class Role(StrEnum):
    """What the engine does with a request once its prompt is computed."""

    COLOCATED = "colocated"  # prefill and decode in one engine
    PREFILL = "prefill"  # finish after token 1, keep blocks pinned until released
    DECODE = "decode"  # admits requests whose KV was filled from outside


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        if name not in _DTYPES.values():
            raise ValueError(f"dtype {name} is not supported (float32, bfloat16, float16)")
        return name
    try:
        return _DTYPES[name.lower()]
    except KeyError:
        raise ValueError(
            f"dtype {name!r} is not supported; use one of {sorted(set(_DTYPES))}"
        ) from None


QUANTIZATIONS = ("auto", "none", "gguf", "awq", "gptq", "fp8", "mxfp4")  # engine.model.quant's
# float32_matmul_precision: torch.set_float32_matmul_precision's values ("high" is not built)
MATMUL_PRECISIONS = ("highest", "medium")
CUDA_MAX_NUM_SEQS = 256  # engine_config()'s default on CUDA (EngineConfig's is for the CPU)


@dataclass(frozen=True)
class EngineConfig:
    """Static engine settings. Runtime-discovered numbers (block count) live in engine state."""

    model_dir: Path
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    role: Role = Role.COLOCATED
    block_size: int = 16
    # KV cache size, the first that is set (engine.kv.sizing): num_kv_blocks, else
    # kv_cache_memory_gb, else on CUDA gpu_memory_utilization of the device's memory minus the
    # weights and the activation peak, else (CPU) 1 GiB.
    num_kv_blocks: int | None = None
    kv_cache_memory_gb: float | None = None
    gpu_memory_utilization: float = 0.9
    # KV cache element type (engine.kv_format.rows): auto (the model dtype), int8 or fp8_e4m3
    # (one-byte codes, a bf16 scale and mid per half row: about 3.6x the tokens of fp32).
    kv_cache_dtype: str = "auto"
    max_num_seqs: int = 64  # engine_config(): 256 on CUDA
    max_num_batched_tokens: int = 2048  # token budget per step
    max_model_len: int | None = None  # None: model's max_position_embeddings
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    attention_backend: str = "auto"  # auto | torch | triton
    # CPU fp32: keep packed copies of the linear weights for the C linear kernel
    # (engine.model.linear), faster at every step size, at the cost of a second copy of them.
    pack_cpu_weights: bool = True
    # CPU fp32: C kernels (engine.cpu_kernels) for decode attention, rotary + KV write and
    # SiLU * up, where a C compiler is found; else the torch ops.
    cpu_kernels: bool = True
    # "safetensors": the checkpoint in model_dir; "random": seeded random weights of the
    # shape in model_dir/config.json (benchmarks of published shapes without their weights).
    load_format: str = "safetensors"
    # Weights kept quantized (engine.model.quant): "gguf" loads the directory's *.gguf file
    # packed; "auto" picks it on a CPU fp32 engine when the directory has one; "none": fp32.
    # "awq", "gptq", "fp8", "mxfp4": what a checkpoint's quantization_config declares ("auto"
    # too).
    quantization: str = "auto"
    # torch's name and values: "highest" keeps every product fp32-accurate; "medium" lets
    # the decoder layers' packed products on AMX tiles (prefill chunks, decode batches over
    # a few rows) take bf16 inputs, summed in fp32: a bf16 model's precision, about 3x the
    # speed. Elsewhere (no AMX, unpacked weights, CUDA) the products stay as they are.
    float32_matmul_precision: str = "highest"
    # Plan step N + 1 while step N runs (one host sync per step; stops by token seen one
    # step late, same output). Off in the prefill role. None: on where the device runs
    # the step asynchronously (CUDA); on the CPU the forward runs in the calling thread, so
    # overlap would only hand each token out one step later.
    async_scheduling: bool | None = None
    # Speculative decoding (engine.speculative): "none", "ngram" (prompt lookup) or "draft"
    # (a smaller model of the same vocabulary in draft_model). Up to num_speculative_tokens
    # guesses per decoding request are verified in one forward; a step that proposes runs
    # without overlap (on a GPU, stretches whose proposals grant nothing overlap).
    speculative_method: str = "none"
    num_speculative_tokens: int = 4
    draft_model: Path | None = None
    ngram_min: int = 1  # shortest suffix the ngram proposer matches
    ngram_max: int = 4  # longest
    # KV tiers below the device (engine.kv.offload): GiB of host memory (pinned on CUDA)
    # for evicted prefix blocks and swapped-out requests, and a directory with its GiB for
    # block files that outlive a restart (written through the host tier, so it needs it).
    kv_offload_cpu_gb: float | None = None
    kv_offload_disk_path: Path | None = None
    kv_offload_disk_gb: float | None = None
    # Multi-LoRA (engine.lora): requests may name a PEFT adapter; up to max_loras distinct
    # adapters run in one step (device slots), ranks up to max_lora_rank, and up to
    # max_cpu_loras parsed adapters stay in host memory (None: max_loras).
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    # Tensor parallelism (engine.parallel): the model's heads, MLP rows, experts and
    # vocabulary split over this many ranks, one process each (rank 0 is the engine's own);
    # each holds 1/N of the weights and its heads' share of the KV cache (sized per rank).
    tensor_parallel_size: int = 1
    # Pipeline parallelism (engine.parallel.pipeline): contiguous layer stages, each of
    # tensor_parallel_size ranks holding its layers' weights and KV cache; a step's rows
    # flow through them in micro-batches.
    pipeline_parallel_size: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_dir", Path(self.model_dir))
        object.__setattr__(self, "dtype", parse_dtype(self.dtype))
        object.__setattr__(self, "role", Role(self.role))
        if not str(self.device).startswith(("cpu", "cuda")):
            raise ValueError(f"device {self.device!r} is not supported (cpu, cuda, cuda:N)")
        if str(self.device).startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r} asked for, but CUDA is not available")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"EngineConfig.{name} must be an integer >= 1, got {value!r}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"EngineConfig.num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.kv_cache_memory_gb is not None and self.kv_cache_memory_gb <= 0:
            raise ValueError(
                f"EngineConfig.kv_cache_memory_gb must be > 0, got {self.kv_cache_memory_gb}"
            )
        check_fraction(self.gpu_memory_utilization, "EngineConfig.gpu_memory_utilization")
        check_kv_cache_dtype(self.kv_cache_dtype, "EngineConfig.kv_cache_dtype")
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ValueError(
                f"EngineConfig.attention_backend must be auto, torch or triton, "
                f"got {self.attention_backend!r}"
            )
        if self.load_format not in ("safetensors", "random"):
            raise ValueError(
                f"EngineConfig.load_format must be safetensors or random, got {self.load_format!r}"
            )
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"EngineConfig.quantization must be one of {', '.join(QUANTIZATIONS)}, "
                f"got {self.quantization!r}"
            )
        if self.float32_matmul_precision not in MATMUL_PRECISIONS:
            raise ValueError(
                f"EngineConfig.float32_matmul_precision must be one of "
                f"{', '.join(MATMUL_PRECISIONS)}, got {self.float32_matmul_precision!r}"
            )
        check_speculative(self)
        check_offload(self)
        check_lora(self)
        check_parallel(self)
        if (
            not self.enable_chunked_prefill
            and self.max_model_len is not None
            and self.max_model_len > self.max_num_batched_tokens
        ):
            raise ValueError(
                "without chunked prefill, max_num_batched_tokens "
                f"({self.max_num_batched_tokens}) must be >= max_model_len ({self.max_model_len})"
            )


SPECULATIVE_METHODS = ("none", "ngram", "draft")


def check_speculative(config: EngineConfig) -> None:
    """ValueError naming the bad speculative setting."""
    method = config.speculative_method
    if method not in SPECULATIVE_METHODS:
        raise ValueError(
            f"EngineConfig.speculative_method must be one of {', '.join(SPECULATIVE_METHODS)}, "
            f"got {method!r}"
        )
    k = config.num_speculative_tokens
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 16:
        raise ValueError(f"EngineConfig.num_speculative_tokens must be in [1, 16], got {k!r}")
    if not 1 <= config.ngram_min <= config.ngram_max:
        raise ValueError(
            f"EngineConfig ngram sizes must satisfy 1 <= ngram_min <= ngram_max, got "
            f"{config.ngram_min} and {config.ngram_max}"
        )
    if method == "draft":
        if config.draft_model is None:
            raise ValueError("EngineConfig.speculative_method 'draft' needs draft_model")
        object.__setattr__(config, "draft_model", Path(config.draft_model))
        if not (Path(config.draft_model) / "config.json").is_file():
            raise ValueError(
                f"EngineConfig.draft_model {str(config.draft_model)!r} is not a model "
                "directory (no config.json)"
            )
    elif config.draft_model is not None:
        raise ValueError(
            f"EngineConfig.draft_model is set but speculative_method is {method!r} (use 'draft')"
        )


def check_lora(config: EngineConfig) -> None:
    """ValueError naming the bad LoRA setting."""
    for name in ("max_loras", "max_lora_rank"):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"EngineConfig.{name} must be an integer >= 1, got {value!r}")
    cpu = config.max_cpu_loras
    if cpu is None:
        object.__setattr__(config, "max_cpu_loras", config.max_loras)
    elif not isinstance(cpu, int) or cpu < config.max_loras:
        raise ValueError(
            f"EngineConfig.max_cpu_loras must be an integer >= max_loras ({config.max_loras}), "
            f"got {cpu!r}"
        )
    if config.enable_lora and config.speculative_method != "none":
        raise ValueError("EngineConfig.enable_lora does not work with speculative decoding yet")


def check_parallel(config: EngineConfig) -> None:
    """ValueError naming the bad parallelism setting or the feature it cannot go with."""
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"EngineConfig.{name} must be an integer >= 1, got {value!r}")
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    if tp * pp == 1:
        return
    name = f"tensor_parallel_size={tp}" if pp == 1 else f"pipeline_parallel_size={pp}"
    if tp > 1 and pp > 1:
        name = f"tensor_parallel_size={tp} x pipeline_parallel_size={pp}"
    if config.speculative_method != "none":
        raise ValueError(f"EngineConfig.{name} does not go with speculative decoding yet")
    if config.kv_offload_cpu_gb is not None:
        raise ValueError(f"EngineConfig.{name} does not go with KV tiers yet")
    if config.enable_lora:
        raise ValueError(f"EngineConfig.{name} does not go with LoRA yet")
    if str(config.device).startswith("cuda"):
        first = int(str(config.device).split(":")[1]) if ":" in str(config.device) else 0
        if first + tp * pp > torch.cuda.device_count():
            raise ValueError(
                f"EngineConfig.{name} needs GPUs {first}..{first + tp * pp - 1}, "
                f"found {torch.cuda.device_count()}"
            )


def check_offload(config: EngineConfig) -> None:
    """ValueError naming the bad KV tier setting."""
    for name in ("kv_offload_cpu_gb", "kv_offload_disk_gb"):
        value = getattr(config, name)
        if value is not None and not value > 0:
            raise ValueError(f"EngineConfig.{name} must be > 0, got {value!r}")
    path, disk_gb = config.kv_offload_disk_path, config.kv_offload_disk_gb
    if (path is None) != (disk_gb is None):
        raise ValueError(
            "EngineConfig.kv_offload_disk_path and kv_offload_disk_gb go together, got "
            f"{path!r} and {disk_gb!r}"
        )
    if path is not None:
        object.__setattr__(config, "kv_offload_disk_path", Path(path))
        if config.kv_offload_cpu_gb is None:
            raise ValueError(
                "EngineConfig.kv_offload_disk_path needs kv_offload_cpu_gb (the disk tier is "
                "written through the host tier)"
            )


def engine_config(
    model_dir: Path, *, device: str = "auto", dtype: str | torch.dtype = "auto", **options: Any
) -> EngineConfig:
    """An EngineConfig with the device's defaults: "auto" is CUDA when available, else CPU;
    on CUDA the dtype defaults to bfloat16 and max_num_seqs to 256, on the CPU to float32
    and 64.

    `options` are the other EngineConfig fields (role, block_size, num_kv_blocks...); None
    values keep the default.
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = device.startswith("cuda")
    if dtype == "auto":
        dtype = "bfloat16" if cuda else "float32"
    given = {k: v for k, v in options.items() if v is not None}
    if cuda:
        given.setdefault("max_num_seqs", CUDA_MAX_NUM_SEQS)
    return EngineConfig(model_dir=Path(model_dir), device=device, dtype=parse_dtype(dtype), **given)


def check_fraction(value: float, name: str = "gpu_memory_utilization") -> None:
    """ValueError unless 0 < value <= 1."""
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")
