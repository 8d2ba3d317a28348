"""Engine configuration: one frozen dataclass, validated at construction, torch-free at import
(the launcher and the chart's schema read its declarations).

The fields declared with `setting(...)` are the engine's settings: a node takes them as flags
and SPLITSERVE_* variables (config_kit); the others are for code that builds an engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from config_kit import Helm, Up, check_fields, setting
from engine.config_checks import (
    check_lora,
    check_offload,
    check_parallel,
    check_speculative,
    parallel_name,
)
from engine.kv_format.dtypes import KV_CACHE_DTYPES

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16", "float16")
_DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class Role(StrEnum):
    """What the engine does with a request once its prompt is computed."""

    COLOCATED = "colocated"  # prefill and decode in one engine
    PREFILL = "prefill"  # finish after token 1, keep blocks pinned until released
    DECODE = "decode"  # admits requests whose KV was filled from outside


def dtype_name(value: Any) -> str:
    """A dtype's name: "float32", "bfloat16", "float16" (or "auto") from a name, one of its
    aliases (fp32, bf16, fp16) or a torch.dtype; ValueError naming an unsupported one."""
    name = str(value).removeprefix("torch.").lower()
    name = _DTYPE_ALIASES.get(name, name)
    if name not in (*DTYPES, "auto"):
        raise ValueError(f"dtype {value!r} is not supported; use one of {', '.join(DTYPES)}")
    return name


def parse_dtype(value: str | torch.dtype) -> torch.dtype:
    """The torch dtype of a name, alias or torch.dtype (float32, bfloat16, float16)."""
    import torch

    name = dtype_name(value)
    if name == "auto":
        raise ValueError("dtype 'auto' depends on the device: resolve it first")
    return getattr(torch, name)  # type: ignore[no-any-return]


QUANTIZATIONS = ("auto", "none", "gguf", "awq", "gptq", "fp8", "mxfp4")  # engine.model.quant's
# float32_matmul_precision: torch.set_float32_matmul_precision's values ("high" is not built)
MATMUL_PRECISIONS = ("highest", "medium")
SPECULATIVE_METHODS = ("none", "ngram", "draft")
CUDA_MAX_NUM_SEQS = 256  # engine_config()'s default on CUDA (EngineConfig's is for the CPU)
DEVICE_PATTERN = r"auto|cpu|cuda(:[0-9]+)?"


@dataclass(frozen=True)
class EngineConfig:
    """Static engine settings. Runtime-discovered numbers (block count) live in engine state."""

    model_dir: Path
    dtype: str = setting(
        "float32", "weights and KV cache dtype (auto: bfloat16 on CUDA, float32 on CPU; a node's "
        "default)", choices=("auto", *DTYPES), normalize=dtype_name,
    )  # fmt: skip
    device: str = setting(
        "cpu", "where the engine runs: auto (a node's default: CUDA when available), cpu, cuda "
        "or cuda:N", pattern=DEVICE_PATTERN, metavar="{auto,cpu,cuda}", helm=Helm.CHART,
    )  # fmt: skip
    role: Role = Role.COLOCATED
    block_size: int = setting(16, "tokens per KV block", ge=1, le=1024)
    # KV cache size, the first that is set (engine.kv.sizing): num_kv_blocks, else
    # kv_cache_memory_gb, else on CUDA gpu_memory_utilization of the device's memory minus the
    # weights and the activation peak, else (CPU) 1 GiB.
    num_kv_blocks: int | None = setting(None, "KV blocks to allocate (else sized by memory)", ge=1)
    kv_cache_memory_gb: float | None = setting(
        None, "memory for the KV cache, in GiB (default: on CUDA sized by "
        "--gpu-memory-utilization, on CPU 1)", gt=0,
    )  # fmt: skip
    gpu_memory_utilization: float = setting(
        0.9, "CUDA: share of the GPU's memory for weights, activations and KV cache together, "
        "when neither --num-kv-blocks nor --kv-cache-memory-gb is set (default 0.9; `up`: for "
        "all its nodes together, each gets an equal part)", gt=0, le=1, up=Up.SHARE,
    )  # fmt: skip
    # KV cache element type (engine.kv_format.rows): auto (the model dtype), int8 or fp8_e4m3
    # (one-byte codes, a bf16 scale and mid per half row: about 3.6x the tokens of fp32).
    kv_cache_dtype: str = setting(
        "auto", "KV cache dtype: auto (the model dtype), int8 or fp8_e4m3 (one-byte codes with a "
        "scale and a mid per half row: about 3.6x the tokens of float32); `up`: a decode node "
        "converts KV of another dtype on import", choices=KV_CACHE_DTYPES, up=Up.POOL,
    )  # fmt: skip
    max_num_seqs: int = setting(
        64, "requests batched together at most (default 256 on CUDA, 64 on CPU)", ge=1
    )
    max_num_batched_tokens: int = setting(2048, "tokens computed per engine step at most", ge=1)
    max_model_len: int | None = setting(
        None, "context length (default: the model's; `up`: the router's too)", ge=1
    )
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    # hybrid models (linear-attention layers, Qwen3-Next): slots of checkpointed states at
    # block boundaries, the only places a prefix-cache hit can resume from
    # (engine.kv.state_checkpoints); None: max_num_seqs, 0: no prefix hits
    linear_state_checkpoints: int | None = setting(
        None, "hybrid (linear-attention) models: checkpoints of the layers' states at block "
        "boundaries kept for prefix-cache hits, each the size of a request's states (default: "
        "--max-num-seqs; 0: no prefix-cache hits)", ge=0, up=Up.POOL,
    )  # fmt: skip
    attention_backend: str = "auto"  # auto | torch | triton
    # CPU fp32: keep packed copies of the linear weights for the C linear kernel
    # (engine.model.linear), faster at every step size, at the cost of a second copy of them.
    pack_cpu_weights: bool = True
    # CPU fp32: C kernels (engine.cpu_kernels) for decode attention, rotary + KV write and
    # SiLU * up, where a C compiler is found; else the torch ops.
    cpu_kernels: bool = True
    load_format: str = setting(
        "safetensors", "safetensors (the checkpoint in the model directory) or random (seeded "
        "random weights of the shapes in its config.json: published shapes without their "
        "weights, for benchmarks)", choices=("safetensors", "random"),
    )  # fmt: skip
    quantization: str = setting(
        "auto", "weights kept quantized: gguf (the model directory's GGUF, packed), awq, gptq, "
        "fp8 or mxfp4 (what the checkpoint's quantization_config declares), none (fp32 "
        "safetensors) or auto (the checkpoint's declared method; else gguf when the directory's "
        "weights are a GGUF alone, or on a CPU float32 engine when it has one)",
        choices=QUANTIZATIONS,
    )  # fmt: skip
    # torch's name and values: "highest" keeps every product fp32-accurate; "medium" lets
    # the decoder layers' packed products on AMX tiles (prefill chunks, decode batches over
    # a few rows) take bf16 inputs, summed in fp32: a bf16 model's precision, about 3x the
    # speed. Elsewhere (no AMX, unpacked weights, CUDA) the products stay as they are.
    float32_matmul_precision: str = setting(
        "highest", "highest (every product fp32-accurate) or medium (torch's name: on AMX CPUs "
        "the packed layers' products over many rows take bf16 inputs, summed in fp32: a bf16 "
        "model's precision, prefill about 2x faster)", choices=MATMUL_PRECISIONS,
    )  # fmt: skip
    # CPU packed weights (GGUF, AWQ, GPTQ): every product rounds each activation row to int8
    # per block of 32 (Q8_0, as llama.cpp) and runs on integer dot products (AVX2, AVX-512
    # VNNI; engine.cpu_kernels.quant_int8), 2-3x the exact kernel's speed. Opt-in, as every
    # setting that changes precision: by default each product is exact to the fp32
    # conversion's (the transformers oracle's answers).
    int8_activations: bool = setting(
        False, "CPU packed weights: products on int8-rounded activations and integer dot "
        "products (faster; greedy tokens may differ from the exact path)", helm=Helm.CHART,
    )  # fmt: skip
    # Plan step N + 1 while step N runs (one host sync per step; stops by token seen one
    # step late, same output). Off in the prefill role. None: on where the device runs
    # the step asynchronously (CUDA); on the CPU the forward runs in the calling thread, so
    # overlap would only hand each token out one step later.
    async_scheduling: bool | None = None
    # CUDA: decode steps replay CUDA graphs captured at start for batch-size buckets up to
    # max_num_seqs (engine.step.graphs); the CPU always runs eagerly.
    enforce_eager: bool = setting(
        False, "CUDA: run every step kernel by kernel, without the decode CUDA graphs captured "
        "at start (the CPU always does)", helm=Helm.CHART,
    )  # fmt: skip
    # Speculative decoding (engine.speculative): up to num_speculative_tokens guesses per
    # decoding request are verified in one forward; a step that proposes runs without
    # overlap (on a GPU, stretches whose proposals grant nothing overlap).
    speculative_method: str = setting(
        "none", "speculative decoding on decode and colocated nodes: none, ngram (prompt lookup) "
        "or draft (a smaller model, --draft-model)", choices=SPECULATIVE_METHODS, up=Up.DECODE,
        helm=Helm.CHART,
    )  # fmt: skip
    num_speculative_tokens: int = setting(
        4, "speculative decoding: tokens guessed per step and request at most (1 to 16, default "
        "4)", ge=1, le=16, up=Up.DECODE, helm=Helm.CHART,
    )  # fmt: skip
    draft_model: Path | None = setting(
        None, "speculative decoding: the draft model (a model directory; a node also takes a "
        "registry name), same vocabulary as the model", up=Up.DECODE, helm=Helm.CHART,
    )  # fmt: skip
    ngram_min: int = 1  # shortest suffix the ngram proposer matches
    ngram_max: int = 4  # longest
    # KV tiers below the device (engine.kv.offload): host memory for evicted prefix blocks and
    # swapped-out requests, and block files that outlive a restart, written through the host
    # tier (so the disk tier needs it).
    kv_offload_cpu_gb: float | None = setting(
        None, "GiB of host memory (pinned on CUDA) for KV blocks evicted from the device and for "
        "preempted requests swapped out (default: no host tier)", gt=0, helm=Helm.CHART,
    )  # fmt: skip
    kv_offload_disk_path: Path | None = setting(
        None, "directory for KV block files that outlive a restart (an emptyDir or a volume; "
        "needs --kv-offload-cpu-gb and --kv-offload-disk-gb; `up`: each node a subdirectory)",
        up=Up.SUBDIR, helm=Helm.CHART,
    )  # fmt: skip
    kv_offload_disk_gb: float | None = setting(
        None, "GiB of KV block files under --kv-offload-disk-path", gt=0, helm=Helm.CHART
    )
    # Multi-LoRA (engine.lora): requests may name a PEFT adapter; up to max_loras distinct
    # adapters run in one step (device slots), ranks up to max_lora_rank, and up to
    # max_cpu_loras parsed adapters stay in host memory (None: max_loras).
    enable_lora: bool = setting(False, "serve LoRA adapters", helm=Helm.CHART)
    max_loras: int = setting(
        1, "LoRA: distinct adapters in one batch at most (device slots, default 1)", ge=1,
        helm=Helm.CHART,
    )  # fmt: skip
    max_lora_rank: int = setting(
        16, "LoRA: the largest adapter rank served (default 16)", ge=1, helm=Helm.CHART
    )
    max_cpu_loras: int | None = setting(
        None, "LoRA: adapters kept in host memory (default: --max-loras)", ge=1, helm=Helm.CHART
    )
    # Tensor parallelism (engine.parallel): the model's heads, MLP rows, experts and
    # vocabulary split over this many ranks, one process each (rank 0 is the engine's own);
    # each holds 1/N of the weights and its heads' share of the KV cache (sized per rank).
    tensor_parallel_size: int = setting(
        1, "ranks the model is split over, one process each (GPUs: one each)", ge=1,
        aliases=("tp",), up=Up.POOL,
    )  # fmt: skip
    # Pipeline parallelism (engine.parallel.pipeline): contiguous layer stages, each of
    # tensor_parallel_size ranks holding its layers' weights and KV cache; a step's rows
    # flow through them in micro-batches.
    pipeline_parallel_size: int = setting(
        1, "layer stages, each of --tensor-parallel-size ranks (GPUs: TP x PP)", ge=1,
        aliases=("pp",), up=Up.POOL,
    )  # fmt: skip

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_dir", Path(self.model_dir))
        object.__setattr__(self, "role", Role(self.role))
        check_fields(self)
        if self.device == "auto":
            object.__setattr__(self, "device", default_device())
        if self.dtype == "auto":
            object.__setattr__(self, "dtype", default_dtype(self.device))
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ValueError(
                f"EngineConfig.attention_backend must be auto, torch or triton, "
                f"got {self.attention_backend!r}"
            )
        if self.max_cpu_loras is None:
            object.__setattr__(self, "max_cpu_loras", self.max_loras)
        self.check_relations(self)
        check_environment(self)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The weights' and KV cache's torch dtype."""
        return parse_dtype(self.dtype)

    @staticmethod
    def check_relations(config: Any) -> None:
        """ValueError naming settings that do not go together (reads attributes only: a
        node's given settings are checked with it before any engine is built)."""
        if config.num_kv_blocks is not None and config.kv_cache_memory_gb is not None:
            raise ValueError("set num_kv_blocks or kv_cache_memory_gb, not both")
        check_speculative(config)
        check_offload(config)
        check_lora(config)
        check_parallel(config)
        if (
            not config.enable_chunked_prefill
            and config.max_model_len is not None
            and config.max_model_len > config.max_num_batched_tokens
        ):
            raise ValueError(
                "without chunked prefill, max_num_batched_tokens "
                f"({config.max_num_batched_tokens}) must be >= max_model_len "
                f"({config.max_model_len})"
            )


def check_environment(config: EngineConfig) -> None:
    """ValueError naming what this machine lacks: CUDA, enough GPUs, the draft model."""
    if config.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"device {config.device!r} asked for, but CUDA is not available")
        first = int(config.device.split(":")[1]) if ":" in config.device else 0
        tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
        if tp * pp > 1 and first + tp * pp > torch.cuda.device_count():
            raise ValueError(
                f"EngineConfig.{parallel_name(tp, pp)} needs GPUs {first}..{first + tp * pp - 1}, "
                f"found {torch.cuda.device_count()}"
            )
    draft = config.draft_model
    if draft is not None and not (draft / "config.json").is_file():
        raise ValueError(
            f"EngineConfig.draft_model {str(draft)!r} is not a model directory (no config.json)"
        )


def default_device() -> str:
    """cuda when torch sees a GPU, else cpu."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str) -> str:
    return "bfloat16" if device.startswith("cuda") else "float32"


def engine_config(
    model_dir: Path, *, device: str = "auto", dtype: Any = "auto", **options: Any
) -> EngineConfig:
    """An EngineConfig with the device's defaults: "auto" is CUDA when available, else CPU;
    on CUDA the dtype defaults to bfloat16 and max_num_seqs to 256, on the CPU to float32
    and 64.

    `options` are the other EngineConfig fields (role, block_size, num_kv_blocks...); None
    values keep the default.
    """
    if device == "auto":
        device = default_device()
    given = {k: v for k, v in options.items() if v is not None}
    if device.startswith("cuda"):
        given.setdefault("max_num_seqs", CUDA_MAX_NUM_SEQS)
    return EngineConfig(model_dir=Path(model_dir), device=device, dtype=dtype, **given)


def checkpoint_slots(config: EngineConfig) -> int:
    """The state checkpoints a hybrid model's engine keeps (0: none, no prefix hits)."""
    n = config.linear_state_checkpoints
    if not config.enable_prefix_caching:
        return 0
    return config.max_num_seqs if n is None else n


def check_fraction(value: float, name: str = "gpu_memory_utilization") -> None:
    """ValueError unless 0 < value <= 1."""
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")
