"""The ``kv_cache_dtype`` names (vLLM's): ``auto`` (the model dtype), ``int8`` or ``fp8_e4m3``
(the rows: engine.kv_format.rows). Torch-free: settings and command lines read them before
torch loads."""

from __future__ import annotations

KV_CACHE_DTYPES = ("auto", "int8", "fp8_e4m3")


def check_kv_cache_dtype(value: str, field: str = "kv_cache_dtype") -> str:
    """``value`` when it names a KV cache dtype, else ValueError naming the field."""
    if value not in KV_CACHE_DTYPES:
        raise ValueError(f"{field} must be one of {', '.join(KV_CACHE_DTYPES)}, got {value!r}")
    return value
