"""The KV cache is sized as asked: explicit blocks or GiB win; on CUDA a fraction of the
device's memory minus the weights and the activation peak (checked here against made-up
memory reports); on the CPU 1 GiB. Device defaults of engine_config."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.config import EngineConfig, engine_config
from engine.kv.cache import KVLayout
from engine.kv.sizing import (
    GIB,
    DeviceMemory,
    KVCapacity,
    SharedCache,
    blocks_for_gib,
    blocks_for_gpu,
    plan_kv_cache,
)

LAYOUT = KVLayout(
    model="smollm2", dtype="bfloat16", block_size=16, num_layers=30, num_kv_heads=3, head_dim=64
)
BLOCK = LAYOUT.block_bytes  # 368,640 bytes
H100 = DeviceMemory(total=80 * GIB, free=77 * GIB, weights=2 * GIB, activation_peak=1 * GIB)


def never_measured() -> DeviceMemory:
    raise AssertionError("the GPU was profiled although the size was given")


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """EngineConfig(device="cuda") is accepted; nothing here touches a GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_fraction_of_total_minus_weights_and_activations() -> None:
    assert blocks_for_gpu(H100, 0.9, BLOCK) == (72 * GIB - 3 * GIB) // BLOCK
    assert blocks_for_gpu(H100, 1.0, BLOCK) == (77 * GIB - 1 * GIB) // BLOCK  # free caps it
    assert blocks_for_gpu(H100, 0.5, BLOCK) == (40 * GIB - 3 * GIB) // BLOCK


def test_memory_held_by_others_caps_the_cache() -> None:
    """Another process on the GPU: the cache takes what is free, keeping the activations."""
    shared = DeviceMemory(total=80 * GIB, free=20 * GIB, weights=2 * GIB, activation_peak=1 * GIB)
    assert blocks_for_gpu(shared, 0.9, BLOCK) == (20 * GIB - 1 * GIB) // BLOCK


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.01, 2.0])
def test_fraction_outside_zero_one_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError, match=r"gpu_memory_utilization must be in \(0, 1\]"):
        blocks_for_gpu(H100, fraction, BLOCK)


def test_no_room_for_one_block_names_the_numbers() -> None:
    full = DeviceMemory(total=80 * GIB, free=6 * GIB, weights=70 * GIB, activation_peak=3 * GIB)
    with pytest.raises(ValueError) as err:
        blocks_for_gpu(full, 0.9, BLOCK)
    message = str(err.value)
    for part in ("72.00 GiB", "weights 70.00 GiB", "activation peak 3.00 GiB", "-1.00 GiB"):
        assert part in message, message
    assert f"{BLOCK} bytes" in message and "num_kv_blocks" in message


def test_exactly_one_block_fits() -> None:
    tight = DeviceMemory(total=6 * BLOCK, free=6 * BLOCK, weights=BLOCK, activation_peak=BLOCK)
    assert blocks_for_gpu(tight, 0.5, BLOCK) == 1  # 3 blocks' worth minus 2
    with pytest.raises(ValueError, match="no room for one KV block"):
        blocks_for_gpu(tight, 0.25, BLOCK)


@pytest.mark.parametrize(
    "fields",
    [
        {"total": GIB, "free": 2 * GIB, "weights": 0, "activation_peak": 0},
        {"total": GIB, "free": GIB, "weights": -1, "activation_peak": 0},
        {"total": GIB, "free": GIB, "weights": 0, "activation_peak": 0.5},
        {"total": GIB, "free": GIB, "weights": 0, "activation_peak": 0, "graphs": -1},
    ],
)
def test_memory_report_is_validated(fields: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="DeviceMemory"):
        DeviceMemory(**fields)


def test_gib_budget() -> None:
    assert blocks_for_gib(0.5, BLOCK) == (GIB // 2) // BLOCK
    with pytest.raises(ValueError, match="kv_cache_memory_gb"):
        blocks_for_gib(1e-6, BLOCK)


def test_explicit_sizes_win_and_the_cpu_takes_one_gib(tmp_path: Path) -> None:
    plan = plan_kv_cache(EngineConfig(tmp_path, num_kv_blocks=7), LAYOUT, never_measured)
    assert (plan.num_blocks, plan.sized_by) == (7, "num_kv_blocks")
    plan = plan_kv_cache(EngineConfig(tmp_path, kv_cache_memory_gb=0.5), LAYOUT, never_measured)
    assert (plan.num_blocks, plan.sized_by) == ((GIB // 2) // BLOCK, "kv_cache_memory_gb")
    plan = plan_kv_cache(EngineConfig(tmp_path), LAYOUT, never_measured)
    assert (plan.num_blocks, plan.sized_by) == (GIB // BLOCK, "cpu_default")


@pytest.mark.usefixtures("fake_cuda")
def test_cuda_is_sized_from_the_measured_memory(tmp_path: Path) -> None:
    config = EngineConfig(tmp_path, device="cuda", gpu_memory_utilization=0.5)
    plan = plan_kv_cache(config, LAYOUT, lambda: H100)
    assert plan.sized_by == "gpu_memory_utilization"
    assert plan.num_blocks == (40 * GIB - 3 * GIB) // BLOCK
    explicit = EngineConfig(tmp_path, device="cuda", kv_cache_memory_gb=2.0)
    assert plan_kv_cache(explicit, LAYOUT, never_measured).num_blocks == 2 * GIB // BLOCK


def test_startup_log_has_blocks_tokens_and_gib(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="splitserve.engine.kv.cache"):
        plan_kv_cache(EngineConfig(tmp_path, num_kv_blocks=2912), LAYOUT, never_measured)
    gib = 2912 * BLOCK / GIB
    assert f"kv_cache blocks=2912 tokens={2912 * 16} gib={gib:.3f}" in caplog.text


def test_capacity_in_tokens_and_bytes() -> None:
    capacity = KVCapacity(num_blocks=10, block_size=16, block_bytes=BLOCK, sized_by="x")
    assert (capacity.num_tokens, capacity.num_bytes) == (160, 10 * BLOCK)


def test_fraction_is_validated_with_the_config(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineConfig(tmp_path, gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="kv_cache_memory_gb"):
        EngineConfig(tmp_path, kv_cache_memory_gb=0.0)


@pytest.mark.usefixtures("fake_cuda")
def test_engine_config_defaults_per_device(tmp_path: Path) -> None:
    cuda = engine_config(tmp_path, device="cuda")
    assert (cuda.max_num_seqs, cuda.torch_dtype, cuda.kv_cache_memory_gb) == (
        256,
        torch.bfloat16,
        None,
    )
    assert engine_config(tmp_path, device="cuda", max_num_seqs=8).max_num_seqs == 8
    cpu = engine_config(tmp_path, device="cpu", max_num_seqs=None)
    assert (cpu.max_num_seqs, cpu.torch_dtype) == (64, torch.float32)


# a draft model's cache of as many blocks: 2 layers, 3 KV heads of 64 dims, bf16, 16 tokens
DRAFT = KVLayout(
    model="draft", dtype="bfloat16", block_size=16, num_layers=2, num_kv_heads=3, head_dim=64
).block_bytes  # 24,576 bytes
SHARED = (SharedCache("draft", DRAFT),)


def test_a_draft_cache_shares_every_budget(tmp_path: Path) -> None:
    """Each block costs the target's bytes plus the draft's (one draft block per block)."""
    both = BLOCK + DRAFT
    assert blocks_for_gib(0.5, BLOCK, shared=SHARED) == (GIB // 2) // both
    assert blocks_for_gib(0.5, BLOCK, shared=SHARED) < blocks_for_gib(0.5, BLOCK)
    assert blocks_for_gpu(H100, 0.9, BLOCK, SHARED) == (72 * GIB - 3 * GIB) // both
    assert blocks_for_gpu(H100, 1.0, BLOCK, SHARED) == (77 * GIB - 1 * GIB) // both

    def plan(config: EngineConfig, measure: Callable[[], DeviceMemory]) -> KVCapacity:
        return plan_kv_cache(config, LAYOUT, measure, shared=SHARED)

    budget = plan(EngineConfig(tmp_path, kv_cache_memory_gb=0.5), never_measured)
    assert (budget.num_blocks, budget.sized_by) == ((GIB // 2) // both, "kv_cache_memory_gb")
    assert budget.num_bytes + budget.shared_bytes <= GIB // 2
    cpu = plan(EngineConfig(tmp_path), never_measured)
    assert (cpu.num_blocks, cpu.sized_by) == (GIB // both, "cpu_default")
    exact = plan(EngineConfig(tmp_path, num_kv_blocks=7), never_measured)
    assert (exact.num_blocks, exact.shared_bytes) == (7, 7 * DRAFT)  # an exact count for both


@pytest.mark.usefixtures("fake_cuda")
def test_a_draft_cache_shares_the_gpu_fraction(tmp_path: Path) -> None:
    config = EngineConfig(tmp_path, device="cuda", gpu_memory_utilization=0.5)
    plan = plan_kv_cache(config, LAYOUT, lambda: H100, shared=SHARED)
    assert plan.num_blocks == (40 * GIB - 3 * GIB) // (BLOCK + DRAFT)
    assert plan.num_bytes + plan.shared_bytes <= 40 * GIB - 3 * GIB


def test_a_budget_without_room_for_both_blocks_names_them() -> None:
    with pytest.raises(ValueError) as err:
        blocks_for_gib((BLOCK + DRAFT - 1) / GIB, BLOCK, shared=SHARED)
    assert f"{BLOCK + DRAFT} bytes: target {BLOCK} + draft {DRAFT}" in str(err.value)
    assert "kv_cache_memory_gb" in str(err.value)
    assert blocks_for_gib((BLOCK + DRAFT) / GIB, BLOCK, shared=SHARED) == 1
    # 0.75 x total - weights - activations = BLOCK + DRAFT / 2
    tight = DeviceMemory(
        total=4 * BLOCK, free=4 * BLOCK, weights=BLOCK, activation_peak=BLOCK - DRAFT // 2
    )
    with pytest.raises(ValueError, match=f"target {BLOCK} \\+ draft {DRAFT}"):
        blocks_for_gpu(tight, 0.75, BLOCK, SHARED)  # room for a target block, not for both
    assert blocks_for_gpu(tight, 0.75, BLOCK) == 1


def test_startup_log_has_the_draft_share(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="splitserve.engine.kv.cache"):
        plan_kv_cache(EngineConfig(tmp_path, num_kv_blocks=100), LAYOUT, never_measured, SHARED)
    assert f"block_bytes={BLOCK}+{DRAFT} (target+draft)" in caplog.text
    assert f"draft_gib={100 * DRAFT / GIB:.3f}" in caplog.text


def test_fixed_bytes_of_a_shared_cache_come_off_every_budget_but_an_exact_count(
    tmp_path: Path,
) -> None:
    fixed = (SharedCache("side", DRAFT, fixed_bytes=5 * BLOCK),)
    both = BLOCK + DRAFT
    assert blocks_for_gib(0.5, BLOCK, shared=fixed) == (GIB // 2 - 5 * BLOCK) // both
    assert blocks_for_gpu(H100, 0.9, BLOCK, fixed) == (72 * GIB - 3 * GIB - 5 * BLOCK) // both
    exact = plan_kv_cache(EngineConfig(tmp_path, num_kv_blocks=7), LAYOUT, never_measured, fixed)
    assert (exact.num_blocks, exact.shared_bytes) == (7, 7 * DRAFT + 5 * BLOCK)
    with pytest.raises(ValueError, match=f"after {5 * BLOCK} fixed bytes"):
        blocks_for_gib((both + 5 * BLOCK - 1) / GIB, BLOCK, shared=fixed)
    with pytest.raises(ValueError, match="fixed_bytes"):
        SharedCache("side", DRAFT, fixed_bytes=-1)


@pytest.mark.usefixtures("fake_cuda")
def test_cuda_graphs_come_off_every_gpu_budget(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What the decode CUDA graphs will hold (a made-up capture cost of 2 GiB here) is kept
    free beside the activations, under the fraction and under what is free."""
    with_graphs = DeviceMemory(
        total=80 * GIB, free=77 * GIB, weights=2 * GIB, activation_peak=1 * GIB, graphs=2 * GIB
    )
    assert blocks_for_gpu(with_graphs, 0.9, BLOCK) == (72 * GIB - 5 * GIB) // BLOCK
    assert blocks_for_gpu(with_graphs, 1.0, BLOCK) == (77 * GIB - 3 * GIB) // BLOCK
    config = EngineConfig(tmp_path, device="cuda")
    with caplog.at_level(logging.INFO, logger="splitserve.engine.kv.cache"):
        plan = plan_kv_cache(config, LAYOUT, lambda: with_graphs)
    assert plan.num_blocks == (72 * GIB - 5 * GIB) // BLOCK < blocks_for_gpu(H100, 0.9, BLOCK)
    assert "cuda_graphs_gib=2.00" in caplog.text
    tight = DeviceMemory(
        total=80 * GIB, free=6 * GIB, weights=67 * GIB, activation_peak=3 * GIB, graphs=2 * GIB
    )
    with pytest.raises(ValueError, match=r"CUDA graphs 2\.00 GiB.*enforce_eager"):
        blocks_for_gpu(tight, 0.9, BLOCK)
