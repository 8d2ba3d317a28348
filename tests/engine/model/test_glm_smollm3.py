"""GLM-4.5 MoE (a rotary over part of each head, grouped sigmoid routing) and SmolLM3 (NoPE
layers) beyond the greedy tokens of ``test_families``: a prefix-cache hit, what their
configs parse to, the multi-token prediction layers a GLM checkpoint carries left unread,
and the options the engine does not build refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.model.config import ModelConfig
from engine.model.rope import Rope, Rotary, partial_rotary_order
from tests.engine.model.test_families import NEW_TOKENS, PROMPTS, greedy_tokens
from tests.engine.model.test_mla import check, check_prefix_hit, engine_of
from tests.engine.model.tiny_families import save_family

NAMES = ["glm4_moe", "smollm3"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Path]]:
    out = {}
    for name in NAMES:
        path = tmp_path_factory.mktemp(name)
        out[name] = (save_family(name, path), path)
    return out


@pytest.mark.parametrize("family", NAMES)
def test_a_prefix_cache_hit_keeps_transformers_tokens(
    dirs: dict[str, tuple[Any, Path]], family: str
) -> None:
    check_prefix_hit(*dirs[family])


def test_configs_parse_to_their_options(dirs: dict[str, tuple[Any, Path]]) -> None:
    glm = ModelConfig.from_dir(dirs["glm4_moe"][1])
    assert (glm.family, glm.rope_dims, glm.partial_rotary, glm.qk_norm) == (
        "glm4_moe", 16, True, True,
    )  # fmt: skip
    assert glm.qkv_bias and not glm.o_bias
    assert glm.moe is not None and glm.moe.layers == (1, 2) and glm.moe.correction_bias
    assert (glm.moe.num_groups, glm.moe.topk_groups, glm.moe.scaling) == (4, 2, 2.5)
    assert glm.moe.shared_intermediate_size == 32 and not glm.moe.shared_gate
    smol = ModelConfig.from_dir(dirs["smollm3"][1])
    assert smol.nope_layers == (1, 3) and smol.layer_windows == (0, 7, 0, 7)
    assert [smol.rope_table(i) for i in range(4)] == [0, 1, 0, 1]
    assert [turned for _, turned in smol.rope_tables()] == [16, 0]


def test_partial_rotary_order_turns_transformers_pairs() -> None:
    """A head laid out by ``partial_rotary_order`` and turned by a ``Rotary(turned=...)``
    table of the whole head is transformers' partial rotate-half, permuted the same way."""
    d, turned, positions = 12, 8, torch.arange(5)
    x = torch.randn(5, 1, d)  # [tokens, heads, d]
    table = Rotary(turned, Rope(1e4), 8, torch.float32, "cpu")  # transformers' own width
    cos, sin = (t.repeat(1, 1, 2) for t in table.tables(positions))  # [tokens, 1, turned]
    rot, rest = x[..., :turned], x[..., turned:]
    halves = torch.cat([-rot[..., turned // 2 :], rot[..., : turned // 2]], dim=-1)
    want = torch.cat([rot * cos + halves * sin, rest], dim=-1)
    whole = Rotary(d, Rope(1e4), 8, torch.float32, "cpu", turned=turned)
    cos, sin = whole.tables(positions)  # [tokens, 1, d / 2]
    y = x[..., partial_rotary_order(d, turned)]
    a, b = y[..., : d // 2], y[..., d // 2 :]
    got = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    assert torch.allclose(got, want[..., partial_rotary_order(d, turned)], atol=1e-6)


def test_the_mtp_layers_of_a_glm_checkpoint_are_not_read(
    dirs: dict[str, tuple[Any, Path]], tmp_path: Path
) -> None:
    """GLM-4.5 ships its multi-token prediction layer after the decoder's (layer 3 here):
    the engine serves without it."""
    hf, path = dirs["glm4_moe"]
    for f in path.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    weights = load_file(tmp_path / "model.safetensors")
    last = {k: v for k, v in weights.items() if ".layers.2." in k}
    extra = {k.replace("layers.2.", "layers.3."): v.clone() for k, v in last.items()}
    extra["model.layers.3.eh_proj.weight"] = torch.zeros(64, 128)
    save_file(weights | extra, tmp_path / "model.safetensors")
    check(hf, PROMPTS[:1], [greedy_one(tmp_path)])


def greedy_one(path: Path) -> list[int]:
    tokens = greedy_tokens(engine_of(path, attention_backend="torch"), PROMPTS[:1])[0]
    assert len(tokens) == NEW_TOKENS
    return tokens


@pytest.mark.parametrize(
    ("family", "change", "named"),
    [
        ("glm4_moe", {"rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.3}},
         "partial_rotary_factor=0.3"),
        ("glm4_moe", {"mlp_bias": True}, "mlp_bias=True"),
        ("glm4_moe", {"n_group": 3}, "n_group"),
        ("smollm3", {"no_rope_layers": [1, 0, 1]}, "no_rope_layers"),
        ("smollm3", {"no_rope_layers": None, "no_rope_layer_interval": 0},
         "no_rope_layer_interval"),
        ("llama", {"rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.5}},
         "partial_rotary_factor=0.5"),
    ],
)  # fmt: skip
def test_an_option_not_built_is_refused_by_name(
    dirs: dict[str, tuple[Any, Path]], family: str, change: dict[str, Any], named: str
) -> None:
    raw = dirs["smollm3" if family == "llama" else family][0].config.to_dict()
    if family == "llama":
        raw |= {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    with pytest.raises(ValueError, match=named):
        ModelConfig.from_dict(raw | change, source=f"{family}/config.json")
