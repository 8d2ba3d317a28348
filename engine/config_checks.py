"""Which engine settings go together: checks of EngineConfig's relations, each a ValueError
naming the settings (they read attributes only, so a node checks its given settings before
any engine is built). Torch-free, as engine.config."""

from __future__ import annotations

from typing import Any


def check_speculative(config: Any) -> None:
    """ValueError naming the bad speculative setting."""
    method = config.speculative_method
    if not 1 <= config.ngram_min <= config.ngram_max:
        raise ValueError(
            f"EngineConfig ngram sizes must satisfy 1 <= ngram_min <= ngram_max, got "
            f"{config.ngram_min} and {config.ngram_max}"
        )
    if method == "draft" and config.draft_model is None:
        raise ValueError("EngineConfig.speculative_method 'draft' needs draft_model")
    if method != "draft" and config.draft_model is not None:
        raise ValueError(
            f"EngineConfig.draft_model is set but speculative_method is {method!r} (use 'draft')"
        )


def check_lora(config: Any) -> None:
    """ValueError naming the bad LoRA setting."""
    cpu = config.max_cpu_loras
    if cpu is not None and cpu < config.max_loras:
        raise ValueError(
            f"EngineConfig.max_cpu_loras must be an integer >= max_loras ({config.max_loras}), "
            f"got {cpu!r}"
        )
    if config.enable_lora and config.speculative_method != "none":
        raise ValueError("EngineConfig.enable_lora does not work with speculative decoding yet")


def check_parallel(config: Any) -> None:
    """ValueError naming the feature a TP x PP engine cannot go with yet."""
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    if tp * pp == 1:
        return
    name = parallel_name(tp, pp)
    if config.speculative_method != "none":
        raise ValueError(f"EngineConfig.{name} does not go with speculative decoding yet")
    if config.kv_offload_cpu_gb is not None:
        raise ValueError(f"EngineConfig.{name} does not go with KV tiers yet")
    if config.enable_lora:
        raise ValueError(f"EngineConfig.{name} does not go with LoRA yet")


def parallel_name(tp: int, pp: int) -> str:
    if tp > 1 and pp > 1:
        return f"tensor_parallel_size={tp} x pipeline_parallel_size={pp}"
    return f"tensor_parallel_size={tp}" if pp == 1 else f"pipeline_parallel_size={pp}"


def check_offload(config: Any) -> None:
    """ValueError naming the bad KV tier setting."""
    path, disk_gb = config.kv_offload_disk_path, config.kv_offload_disk_gb
    if (path is None) != (disk_gb is None):
        raise ValueError(
            "EngineConfig.kv_offload_disk_path and kv_offload_disk_gb go together, got "
            f"{path!r} and {disk_gb!r}"
        )
    if path is not None and config.kv_offload_cpu_gb is None:
        raise ValueError(
            "EngineConfig.kv_offload_disk_path needs kv_offload_cpu_gb (the disk tier is "
            "written through the host tier)"
        )


def check_hybrid(config: Any) -> None:
    """ValueError naming the setting an engine of a hybrid model (linear-attention layers
    with a per-request state, Qwen3-Next) does not go with yet (tensor parallelism does:
    the layers are split by key head)."""
    pp = config.pipeline_parallel_size
    refused = {
        f"pipeline_parallel_size={pp}": pp > 1,
        f"speculative_method={config.speculative_method!r}": config.speculative_method != "none",
        # blocks on disk outlive a restart, the state checkpoints a hit resumes from do not
        "kv_offload_disk_path": config.kv_offload_disk_path is not None,
        "enable_lora": config.enable_lora,
    }
    for name, bad in refused.items():
        if bad:
            raise ValueError(
                f"EngineConfig.{name} does not go with a model of linear-attention layers "
                "(their per-request state) yet"
            )
