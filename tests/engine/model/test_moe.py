"""The MoE block equals transformers' own sparse MoE blocks (Mixtral, Qwen3-MoE, Qwen2-MoE with
its shared expert) on the same weights, on the torch, C and Triton backends, whichever layout
the checkpoint names its tensors in."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from safetensors.torch import load_file
from tiny_llama import TRITON_DEVICE
from torch import nn
from transformers import (
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from engine import cpu_kernels
from engine.model.moe import SparseMoe, expert_weight_bytes, route
from engine.model.moe_names import checkpoint_naming, weight_targets

COMMON: dict[str, Any] = {
    "vocab_size": 64,
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
}
PREFIX = "model.layers.0."


class Family(NamedTuple):
    model_cls: type[nn.Module]
    config: Any
    naming: str
    block_args: dict[str, Any]


FAMILIES = {
    "mixtral": Family(
        MixtralForCausalLM,
        MixtralConfig(intermediate_size=48, num_local_experts=8, num_experts_per_tok=2, **COMMON),
        "mixtral",
        {"moe_intermediate": 48, "num_experts": 8, "top_k": 2, "normalize": True},
    ),
    "qwen3_moe": Family(
        Qwen3MoeForCausalLM,
        Qwen3MoeConfig(
            moe_intermediate_size=48,
            intermediate_size=64,
            num_experts=8,
            num_experts_per_tok=3,
            norm_topk_prob=True,
            **COMMON,
        ),
        "qwen_moe",
        {"moe_intermediate": 48, "num_experts": 8, "top_k": 3, "normalize": True},
    ),
    "qwen3_moe_gelu_unnormalised": Family(
        Qwen3MoeForCausalLM,
        Qwen3MoeConfig(
            moe_intermediate_size=32,
            intermediate_size=64,
            num_experts=6,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            hidden_act="gelu_pytorch_tanh",
            **COMMON,
        ),
        "qwen_moe",
        {
            "moe_intermediate": 32,
            "num_experts": 6,
            "top_k": 2,
            "normalize": False,
            "activation": "gelu_tanh",
        },
    ),
    "qwen2_moe_shared": Family(
        Qwen2MoeForCausalLM,
        Qwen2MoeConfig(
            moe_intermediate_size=48,
            intermediate_size=64,
            shared_expert_intermediate_size=64,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            **COMMON,
        ),
        "qwen_moe",
        {
            "moe_intermediate": 48,
            "num_experts": 8,
            "top_k": 2,
            "normalize": False,
            "shared_intermediate": 64,
        },
    ),
}
BACKENDS = ["torch", "c", "triton"]


def _scaled_model(family: Family, seed: int) -> nn.Module:
    """A random one-layer model whose router logits spread over a few units (so the choice of
    experts and their weights both matter) and whose experts keep activations near 1."""
    torch.manual_seed(seed)
    model = family.model_cls(family.config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(3.0 * torch.randn_like(p) / p.shape[-1] ** 0.5)
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    return model


def _block(family: Family, **overrides: Any) -> SparseMoe:
    args = {"activation": "silu"} | family.block_args | overrides
    return SparseMoe(COMMON["hidden_size"], **args, dtype=torch.float32, device="cpu")


def _fill(block: SparseMoe, tensors: dict[str, torch.Tensor], naming: str) -> None:
    """What the loader does: every target filled from the same-named tensor, shape-checked;
    every MoE tensor of the checkpoint has a target."""
    targets = weight_targets(block, PREFIX, naming)
    blocks = (f"{PREFIX}mlp.", f"{PREFIX}block_sparse_moe.")
    moe_names = {n for n in tensors if n.startswith(blocks)}
    assert moe_names == set(targets)
    with torch.no_grad():
        for name, target in targets.items():
            assert tensors[name].shape == target.shape, name
            target.copy_(tensors[name])
    block.pack_cpu_weights()


def _check_backend(block: SparseMoe, backend: str) -> torch.device:
    if backend == "c":
        if not cpu_kernels.available():
            pytest.skip("the CPU kernels need a C compiler (cc or $CC)")
        assert block.packed_experts is not None  # the C path runs, not the torch fallback
    if backend == "triton":
        pytest.importorskip("triton")
        return TRITON_DEVICE
    return torch.device("cpu")


@pytest.fixture(scope="module", params=list(FAMILIES))
def saved(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Family, nn.Module, Path]:
    family = FAMILIES[request.param]
    model = _scaled_model(family, seed=len(request.param))
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)  # transformers 5 writes the hub's per-expert names
    return family, model, path


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_equals_transformers_from_a_saved_checkpoint(
    saved: tuple[Family, nn.Module, Path], backend: str
) -> None:
    family, model, path = saved
    tensors = load_file(path / "model.safetensors")
    naming = checkpoint_naming(tensors, PREFIX, family.naming)
    assert naming == family.naming
    block = _block(family)
    _fill(block, tensors, naming)
    device = _check_backend(block, backend)
    x = torch.randn(13, COMMON["hidden_size"], generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = model.model.layers[0].mlp(x[None])[0]
        got = block.to(device)(x.to(device), backend).cpu()
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family_name", ["mixtral", "qwen2_moe_shared"])
def test_block_fills_from_transformers_fused_layout(family_name: str, backend: str) -> None:
    """transformers 5's modules hold experts fused ([E, 2 I, H] and [E, H, I]); so do the
    checkpoints it saves with save_original_format=False."""
    family = FAMILIES[family_name]
    hf = _scaled_model(family, seed=3).model.layers[0].mlp
    tensors = {f"{PREFIX}mlp.{n}": t for n, t in hf.state_dict().items()}
    assert checkpoint_naming(tensors, PREFIX, family.naming) == "fused"
    block = _block(family)
    _fill(block, tensors, "fused")
    device = _check_backend(block, backend)
    x = torch.randn(9, COMMON["hidden_size"], generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        want = hf(x[None])[0]
        got = block.to(device)(x.to(device), backend).cpu()
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_route_normalises_only_when_asked() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0], [3.0, 3.5, -2.0, 0.0]])
    probs = torch.softmax(logits, dim=-1)
    plain = route(logits, 2, normalize=False)
    assert plain.ids.tolist() == [[1, 2], [1, 0]]
    assert plain.weights.dtype == torch.float32
    torch.testing.assert_close(plain.weights, probs.gather(1, plain.ids))
    normal = route(logits.half(), 2, normalize=True)
    assert normal.weights.dtype == torch.float32 and normal.ids.dtype == torch.int64
    torch.testing.assert_close(normal.weights.sum(-1), torch.ones(2))


def test_c_backend_falls_back_where_the_experts_cannot_be_packed() -> None:
    family = FAMILIES["qwen3_moe"]
    block = _block(family, moe_intermediate=40)  # not a multiple of the 16-column panels
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    block.pack_cpu_weights()
    assert block.packed_experts is None
    x = torch.randn(5, COMMON["hidden_size"])
    torch.testing.assert_close(block(x, "c"), block(x, "torch"))


def test_zero_tokens_give_an_empty_output() -> None:
    block = _block(FAMILIES["qwen2_moe_shared"])
    with torch.no_grad():
        for p in block.parameters():
            p.normal_()
    block.pack_cpu_weights()
    x = torch.empty(0, COMMON["hidden_size"])
    for backend in ("torch", "c"):
        assert block(x, backend).shape == (0, COMMON["hidden_size"])


def test_bad_settings_are_refused_by_name() -> None:
    family = FAMILIES["mixtral"]
    with pytest.raises(ValueError, match="activation 'relu'"):
        _block(family, activation="relu")
    with pytest.raises(ValueError, match="top_k=9"):
        _block(family, top_k=9)
    block = _block(family)
    with pytest.raises(ValueError, match="backend 'cuda'"):
        block(torch.randn(2, COMMON["hidden_size"]), "cuda")
    with pytest.raises(ValueError, match="naming 'llama'"):
        weight_targets(block, PREFIX, "llama")
    shared = _block(FAMILIES["qwen2_moe_shared"])
    with pytest.raises(ValueError, match="no shared expert"):
        weight_targets(shared, PREFIX, "mixtral")


def test_expert_weight_bytes_counts_routed_and_shared_experts() -> None:
    block = _block(FAMILIES["qwen2_moe_shared"])
    e, i, h, s = 8, 48, COMMON["hidden_size"], 64
    expected = 4 * (e * 3 * i * h + 3 * s * h + h)
    assert expert_weight_bytes(block) == expected
    block.pack_cpu_weights()
    if block.packed_experts is not None:  # the packed copies are as large again
        assert expert_weight_bytes(block, include_packed=True) == 2 * expected - 4 * h
