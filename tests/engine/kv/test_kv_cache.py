"""The KV cache is block-major and its layout fingerprint is exact (sizing: test_kv_sizing)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest
import torch

from engine.kv.cache import KVLayout, allocate_kv_cache
from engine.model.config import ModelConfig
from kv_transfer.errors import LayoutMismatch
from tests.engine.model.tiny_families import save_family

LAYOUT = KVLayout(
    model="smollm2", dtype="float32", block_size=16, num_layers=30, num_kv_heads=3, head_dim=64
)


def test_block_bytes_and_shape() -> None:
    assert LAYOUT.block_shape == (30, 2, 16, 3, 64)
    assert LAYOUT.block_bytes == 30 * 2 * 16 * 3 * 64 * 4
    assert dataclasses.replace(LAYOUT, dtype="bfloat16").block_bytes == LAYOUT.block_bytes // 2


def test_each_block_is_one_contiguous_region() -> None:
    layout = dataclasses.replace(LAYOUT, num_layers=3, block_size=4)
    kv = allocate_kv_cache(layout, 5, "cpu")
    assert kv.shape == (5, 3, 2, 4, 3, 64) and kv.is_contiguous()
    base = kv.data_ptr()
    for i in range(5):
        assert kv[i].is_contiguous()
        assert kv[i].data_ptr() - base == i * layout.block_bytes
        assert kv[i].numel() * kv.element_size() == layout.block_bytes


def test_fingerprint_is_stable_and_differs_in_every_field() -> None:
    assert LAYOUT.fingerprint() == dataclasses.replace(LAYOUT).fingerprint()
    changes = {
        "model": "other",
        "dtype": "bfloat16",
        "block_size": 32,
        "num_layers": 31,
        "num_kv_heads": 4,
        "head_dim": 128,
        "layer_windows": (4096,) * 30,
        "kv_dtype": "int8",
        "latent": True,
        "state": "gdn-state[layers=3,conv=8192x3,recurrent=32x128x128:float32]",
    }
    assert set(changes) == {f.name for f in dataclasses.fields(KVLayout)}
    one_head = dataclasses.replace(LAYOUT, num_kv_heads=1)  # a latent is one "head"
    prints = {
        dataclasses.replace(one_head if k == "latent" else LAYOUT, **{k: v}).fingerprint()
        for k, v in changes.items()
    }
    assert len(prints | {LAYOUT.fingerprint(), one_head.fingerprint()}) == len(changes) + 2


def test_a_latent_layout_is_one_plane_of_one_head() -> None:
    latent = KVLayout("ds", "float32", 16, 4, 1, 576, latent=True)
    assert latent.block_shape == (4, 1, 16, 1, 576)
    assert latent.bytes_per_token == 4 * 576 * 4
    assert "latent=576" in latent.describe()
    with pytest.raises(ValueError, match="one KV head"):
        KVLayout("ds", "float32", 16, 4, 2, 576, latent=True)


def test_describe_names_every_field() -> None:
    text = LAYOUT.describe()
    for word in (
        "smollm2",
        "float32",
        "block_size=16",
        "layers=30",
        "kv_heads=3",
        "head_dim=64",
        "windows=full",
        "kv_dtype=auto",
    ):
        assert word in text
    assert LAYOUT.fingerprint() in text


def test_layout_for_model() -> None:
    cfg = ModelConfig.from_dict(
        {
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": 100,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 64,
            "rms_norm_eps": 1e-5,
        },
        name="tiny",
    )
    layout = KVLayout.for_model(cfg, torch.bfloat16, 8)
    assert layout == KVLayout("tiny", "bfloat16", 8, 2, 2, 16)


@pytest.mark.parametrize("bad", [{"block_size": 0}, {"dtype": "int8"}, {"head_dim": 2.5}])
def test_invalid_layout(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        dataclasses.replace(LAYOUT, **bad)


def test_layouts_of_two_families_refuse_each_other_by_name(tmp_path: Path) -> None:
    """A Gemma-style windowed model and a full-attention one never share KV: the
    fingerprints differ and the mismatch error names each field that differs."""
    full = dataclasses.replace(LAYOUT, num_layers=3)
    windowed = dataclasses.replace(
        LAYOUT, model="gemma", num_layers=3, head_dim=128, layer_windows=(512, 0, 512)
    )
    assert full.fingerprint() != windowed.fingerprint()
    assert windowed.windows_text() == "512*1,0*1,512*1" and full.windows_text() == "full"
    message = str(LayoutMismatch(full.describe(), windowed.describe(), "peer-1"))
    for named in ("model (smollm2 here, gemma there)", "head_dim (64 here, 128 there)"):
        assert named in message
    assert "windows (full here, 512*1,0*1,512*1 there)" in message
    assert "dtype (" not in message  # what agrees is not named


def test_full_attention_layout_keeps_its_fingerprint() -> None:
    """Windows enter the hash only where some layer has one: nodes of an older release
    serving the same full-attention model still exchange KV with this one."""
    legacy = "|".join(["block-major", "smollm2", "float32", "16", "30", "3", "64"])
    assert LAYOUT.fingerprint() == hashlib.sha256(legacy.encode()).hexdigest()[:16]
    with pytest.raises(ValueError, match="layer_windows has 2 entries for 30 layers"):
        dataclasses.replace(LAYOUT, layer_windows=(4, 0))


def test_layout_for_windowed_model_names_its_windows(tmp_path: Path) -> None:
    save_family("gemma3", tmp_path)
    layout = KVLayout.for_model(ModelConfig.from_dir(tmp_path), torch.float32, 4)
    assert layout.layer_windows == (7, 0, 7)
    assert "windows=7*1,0*1,7*1" in layout.describe()
