"""The engine's command-line flags that `splitserve generate` (engine.cli) and the nodes
(node.cli) share, declared once: vLLM's names, their help and the LoRA switches. Each command
takes a flag's type and choices from its own settings. Torch-free: the nodes parse their
flags before torch loads."""

from __future__ import annotations

import argparse

# setting -> help of its --flag (dashes for underscores)
ENGINE_FLAGS: dict[str, str] = {
    "quantization": "weights kept quantized: gguf (the model directory's GGUF, packed), awq, "
    "gptq, fp8 or mxfp4 (what the checkpoint's quantization_config declares), none (fp32 "
    "safetensors) or auto (the checkpoint's declared method; else gguf when the directory's "
    "weights are a GGUF alone, or on a CPU float32 engine when it has one)",
    "kv_cache_dtype": "KV cache dtype: auto (the model dtype), int8 or fp8_e4m3 (one-byte codes "
    "with a scale and a mid per half row: about 3.6x the tokens of float32)",
    "max_loras": "LoRA: distinct adapters in one batch at most (device slots, default 1)",
    "max_lora_rank": "LoRA: the largest adapter rank served (default 16)",
    "max_cpu_loras": "LoRA: adapters kept in host memory (default: --max-loras)",
}
LORA_SWITCHES = ("enable_lora", "lora_modules")  # flags of their own (a switch, a list)


def flag(name: str) -> str:
    """The --flag of a setting."""
    return "--" + name.replace("_", "-")


def add_lora_switches(parser: argparse.ArgumentParser) -> None:
    """--enable-lora and --lora-modules NAME=PATH ... (None when not given)."""
    parser.add_argument(
        "--enable-lora", action="store_true", default=None, help="serve LoRA adapters"
    )
    parser.add_argument(
        "--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
        help="LoRA adapters (PEFT directories) loaded at start",
    )  # fmt: skip
