"""DeepSeek-V2 / V3 (multi-head latent attention, grouped MoE routing) against transformers'
own classes on tiny random-weight models: greedy tokens on the C, torch and Triton paths
(prompts over several blocks, prefilled in chunks), a prefix-cache hit, the latent KV
layout, and the routers against transformers' on the same scores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from engine import cpu_kernels
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.kv.cache import KVLayout
from engine.model import mla_attention
from engine.model.config import ModelConfig
from engine.model.routing import Router, route_grouped
from tests.engine.model.test_families import NEW_TOKENS, PATHS, PROMPTS, greedy_tokens
from tests.engine.model.tiny_families import (
    MLA,
    assert_greedy_near,
    hf_greedy_gaps,
    save_family,
)

TIE = 1e-3  # logits of the top two tokens closer than this may swap with summation order


@pytest.fixture(scope="module")
def mla_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Path]]:
    out = {}
    for name in MLA:
        path = tmp_path_factory.mktemp(name)
        out[name] = (save_family(name, path), path)
    return out


def engine_of(path: Path, **kw: Any) -> LLMEngine:
    # blocks of 4 tokens and 16 tokens a step: every prompt spans blocks and steps
    return LLMEngine(
        EngineConfig(
            model_dir=path, dtype="float32", block_size=4, num_kv_blocks=128,
            max_num_batched_tokens=16, **kw,
        )
    )  # fmt: skip


def kernels_only(monkeypatch: pytest.MonkeyPatch, c: bool = True) -> None:
    """The torch path's decode and prefill halves fail the test: the kernel must run (the C
    one unless ``c`` is False; without a C compiler the torch path is the C path's fallback)."""
    if c and not cpu_kernels.available():
        return

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the torch MLA path ran instead of a kernel")

    for name in ("_decodes", "_chunk"):
        monkeypatch.setattr(mla_attention, name, refuse)


def check(hf: Any, prompts: list[list[int]], got: list[list[int]]) -> None:
    for prompt, tokens in zip(prompts, got, strict=True):
        want, gaps = hf_greedy_gaps(hf, prompt, NEW_TOKENS)
        assert_greedy_near(tokens, want, gaps, TIE)


@pytest.mark.parametrize("path_name", list(PATHS))
@pytest.mark.parametrize("family", MLA)
def test_greedy_equals_transformers(
    mla_dirs: dict[str, tuple[Any, Path]],
    family: str,
    path_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the C and Triton paths the MLA kernels run, never the torch path."""
    if path_name == "triton":
        pytest.importorskip("triton")
    if path_name != "torch":
        kernels_only(monkeypatch, c=path_name == "c")
    hf, path = mla_dirs[family]
    prompts = PROMPTS if path_name != "triton" else PROMPTS[:2]
    engine = engine_of(path, **PATHS[path_name])
    check(hf, prompts, greedy_tokens(engine, prompts))
    assert engine.stats().free_blocks == engine.stats().total_blocks


@pytest.mark.parametrize("family", MLA)
def test_a_prefix_cache_hit_reads_the_latent_back(
    mla_dirs: dict[str, tuple[Any, Path]], family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second prompt shares 4 full blocks with the first: only its tail is computed,
    its chunk and decodes attend over the cached latent rows in the C kernel, and the
    tokens are still transformers'."""
    kernels_only(monkeypatch)
    check_prefix_hit(*mla_dirs[family])


def check_prefix_hit(hf: Any, path: Path) -> None:
    """Two prompts sharing 4 full blocks through one engine: the second computes only its
    tail and its tokens are still transformers'."""
    shared = PROMPTS[2][:16]
    first, second = shared + [5, 6, 7], shared + [40, 41, 42, 43, 44]
    engine = engine_of(path, attention_backend="torch")
    check(hf, [first], greedy_tokens(engine, [first]))
    before = engine.counters.tokens_computed
    check(hf, [second], greedy_tokens(engine, [second]))
    assert engine.counters.tokens_computed - before == len(second) - 16 + NEW_TOKENS - 1


def test_the_cache_holds_the_latent(mla_dirs: dict[str, tuple[Any, Path]]) -> None:
    """One plane of kv_lora_rank + qk_rope_head_dim values a token and layer, whatever the
    number of heads; its fingerprint is not a one-head GQA cache's of that width."""
    _, path = mla_dirs["deepseek_v3"]
    config = ModelConfig.from_dir(path)
    layout = KVLayout.for_model(config, "float32", 16)
    assert layout.latent and layout.num_kv_heads == 1 and layout.head_dim == 32 + 8
    assert layout.block_shape == (3, 1, 16, 1, 40)
    gqa = KVLayout(layout.model, "float32", 16, 3, 1, 40)
    assert gqa.fingerprint() != layout.fingerprint()
    assert "latent=40" in layout.describe()
    int8 = layout.with_kv_dtype("int8")
    assert int8.block_shape == (3, 1, 16, 1, 48) and int8.fingerprint() != layout.fingerprint()


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8_e4m3"])
def test_quantized_latent_cache_runs_and_frees_its_blocks(
    mla_dirs: dict[str, tuple[Any, Path]], kv_dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The C kernel reads int8 and fp8 latent rows."""
    kernels_only(monkeypatch)
    _, path = mla_dirs["deepseek_v3"]
    engine = engine_of(path, attention_backend="torch", kv_cache_dtype=kv_dtype)
    assert engine.runner.layout.block_shape[1:] == (1, 4, 1, 48)
    got = greedy_tokens(engine, PROMPTS)
    assert [len(t) for t in got] == [NEW_TOKENS] * len(PROMPTS)
    assert engine.stats().free_blocks == engine.stats().total_blocks


def hf_router(version: str, **config: Any) -> Any:
    """transformers' DeepseekV2TopkRouter or DeepseekV3TopkRouter over 8 experts, top 3."""
    name = f"Deepseek{version.upper()}"
    module = getattr(transformers.models, f"deepseek_{version}")
    router_cls = getattr(getattr(module, f"modeling_deepseek_{version}"), f"{name}TopkRouter")
    shape = {"hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 4}
    cfg = getattr(transformers, f"{name}Config")(
        n_routed_experts=8, num_experts_per_tok=3, **shape, **config
    )
    return router_cls(cfg)


@pytest.mark.parametrize(
    ("version", "config", "router"),
    [
        ("v2", {"topk_method": "greedy"}, Router(3, False, scaling=2.0)),
        (
            "v2",
            {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2},
            Router(3, False, "softmax", "max", 4, 2, 2.0),
        ),
        (
            "v3",
            {"n_group": 4, "topk_group": 2, "norm_topk_prob": True},
            Router(3, True, "sigmoid", "top2", 4, 2, 2.0),
        ),
    ],
    ids=["v2-greedy", "v2-groups", "v3"],
)
def test_routing_picks_transformers_experts(
    version: str, config: dict[str, Any], router: Router
) -> None:
    torch.manual_seed(0)
    hf = hf_router(version, routed_scaling_factor=2.0, **config)
    with torch.no_grad():
        hf.weight.normal_()
        bias = None
        if version == "v3":
            hf.e_score_correction_bias.normal_(0, 0.3)
            bias = hf.e_score_correction_bias
    x = torch.randn(64, 16)
    logits, weights, ids = hf(x)
    got = route_grouped(logits, router, bias)
    order, got_order = ids.sort(dim=-1), got.ids.sort(dim=-1)
    assert torch.equal(order.values, got_order.values)
    want_w = weights.gather(1, order.indices)
    assert torch.allclose(got.weights.gather(1, got_order.indices), want_w, rtol=1e-5)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"moe_layer_freq": 2}, "moe_layer_freq=2"),
        ({"topk_method": "noaux_tc"}, "topk_method='noaux_tc'"),
        ({"scoring_func": "sigmoid"}, "scoring_func='sigmoid'"),
        ({"attention_bias": True}, "attention_bias=True"),
    ],
)
def test_an_option_not_built_is_refused_by_name(
    mla_dirs: dict[str, tuple[Any, Path]], change: dict[str, Any], named: str
) -> None:
    hf, _ = mla_dirs["deepseek_v2"]
    raw = hf.config.to_dict() | change
    with pytest.raises(ValueError, match=named):
        ModelConfig.from_dict(raw, source="v2/config.json")
