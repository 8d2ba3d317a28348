"""bench.kv_bytes: DeepSeek-V3's latent against the per-head K / V its heads read."""

from __future__ import annotations

from bench.kv_bytes import main


def test_the_latent_is_71x_smaller_than_every_heads_k_and_v() -> None:
    rows = main([])["layouts"]
    assert rows["mla_latent"]["bytes_per_token"] == 61 * (512 + 64) * 2  # bf16
    assert rows["mha_128_heads"]["bytes_per_token"] == 61 * 128 * (192 + 128) * 2
    assert rows["gqa_8_heads"]["bytes_per_token"] == 61 * 8 * (192 + 128) * 2
