"""Decode CUDA graphs (engine.step.graphs) as the engine uses them.

On the CPU the graphs' replay is stood in for by the forward they capture, run on the same
padded input buffers (``PaddedForward``): what the engine gives then is what a replay gives,
bar the capture itself. Its greedy tokens equal the eager engine's (with LoRA too), no
padding row writes a KV byte, and the steps a graph must not take run eagerly. The
GPU tests at the end capture and replay for real (marker ``gpu``, skipped without CUDA).
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tiny_llama import TRITON_DEVICE, save_tiny_llama
from tiny_tokenizer import save_byte_tokenizer

from engine import LLM, LoRARequest
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.step.batch import StepInputs
from engine.step.graph_inputs import GraphInputs
from engine.step.graphs import DecodeGraphs, GraphCapture, eager_reason
from models.sampling_params import SamplingParams

pytest.importorskip("triton")

PROMPTS = [[5 + (7 * i + 3 * j) % 100 for j in range(4 + 3 * i)] for i in range(5)]


def params(i: int) -> SamplingParams:
    """Greedy, each prompt its own length: the batch shrinks step by step (5 .. 1 rows)."""
    return SamplingParams(max_tokens=3 + 2 * i, temperature=0.0, ignore_eos=True)


class PaddedForward(DecodeGraphs):
    """The graphs' forward run as captured, on the padded buffers, in place of a replay; each
    run checks that the cache changed only at the step's own slots."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replays: Counter[tuple[int, int]] = Counter()  # (rows, bucket)
        self.steps: list[StepInputs] = []  # every step the runner offered

    def capture(self, sizes: Any) -> GraphCapture:
        self.sizes = tuple(sorted(set(sizes)))
        return GraphCapture(len(self.sizes), 0.0, 0)

    def run(self, inputs: StepInputs) -> torch.Tensor | None:
        self.steps.append(inputs)
        self._rows = inputs.meta.num_decodes
        return super().run(inputs)

    def _replay(self, rows: int) -> torch.Tensor:
        live = set(self.inputs.slot_mapping[: self._rows].tolist())
        before = self.kv_cache.view(torch.uint8).clone()
        inputs = self.inputs
        self._bind(rows)
        try:
            logits = self.model(
                inputs.input_ids[:rows], inputs.meta(rows), self.kv_cache,
                inputs.logits_indices[:rows],
            )  # fmt: skip
        finally:
            self._bind(None)
        self.replays[(self._rows, rows)] += 1
        assert _written_slots(before, self.kv_cache) <= live
        return logits


def _written_slots(before: torch.Tensor, kv: torch.Tensor) -> set[int]:
    changed = before != kv.view(torch.uint8)  # [blocks, layers, 2, block_size, ...]
    per_slot = changed.transpose(1, 3).flatten(2).any(-1)  # [blocks, block_size]
    return set(per_slot.flatten().nonzero().flatten().tolist())


def padded(engine: LLMEngine, sizes: tuple[int, ...]) -> PaddedForward:
    """Put the stand-in graphs of `sizes` on the engine's runner."""
    runner = engine.runner
    lora = runner.lora
    inputs = GraphInputs(
        max(sizes), runner.max_blocks, runner.config.block_size, runner.device, lora is not None
    )
    graphs = PaddedForward(runner.model, runner.kv_cache, inputs, lora)
    graphs.capture(sizes)
    runner.graphs = graphs
    return graphs


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("graphs") / "tiny"
    save_tiny_llama(path, vocab_size=300)
    save_byte_tokenizer(path)
    return path


def _llm(model_dir: Path, **kw: Any) -> LLM:
    options: dict[str, Any] = dict(
        attention_backend="triton", block_size=4, num_kv_blocks=96, max_num_batched_tokens=32,
        max_num_seqs=8, async_scheduling=False,
    )  # fmt: skip
    return LLM(model_dir, device=str(TRITON_DEVICE), **(options | kw))


def _greedy(llm: LLM, **kw: Any) -> list[list[int]]:
    outs = llm.generate(PROMPTS, [params(i) for i in range(len(PROMPTS))], **kw)
    return [o.token_ids for o in outs]


def test_padded_replay_gives_the_eager_tokens(model_dir: Path) -> None:
    """Each decode batch takes its bucket (3 rows padded to 4); prefill steps, and the
    5-row batch wider than the largest bucket, run eagerly. (int8 KV: the padding rows'
    writes are skipped alike, tests/engine/triton_kernels/test_kernel_pad_slot.py; the
    interpreter is too slow for its engine here, the GPU test below runs it.)"""
    eager = _greedy(_llm(model_dir, enforce_eager=True))
    llm = _llm(model_dir)
    graphs = padded(llm.engine, (1, 2, 4))
    assert _greedy(llm) == eager
    assert set(graphs.replays) == {(4, 4), (3, 4), (2, 2), (1, 1)}
    taken = [s for s in graphs.steps if s.plain_decode and s.meta.num_decodes <= 4]
    assert sum(graphs.replays.values()) == len(taken)
    assert any(not s.plain_decode for s in graphs.steps)  # the prefills
    assert any(s.meta.num_decodes == 5 for s in graphs.steps if s.plain_decode)  # too wide
    assert llm.engine.block_manager.num_free_blocks == llm.engine.runner.num_blocks


def test_padded_replay_with_lora_gives_the_eager_tokens(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Adapters are loaded into their slots after the graphs are captured; a batch mixing
    two adapters and the base model."""
    from lora_adapters import make_adapter

    root = tmp_path_factory.mktemp("graph_lora")
    paths = [make_adapter(model_dir, root / f"a{i}", seed=i) for i in (0, 1)]
    loras = [LoRARequest(f"a{i}", i + 1, path) for i, path in enumerate(paths)]
    per_prompt = [loras[0], None, loras[1], loras[0], None]
    kw: dict[str, Any] = dict(enable_lora=True, max_loras=2, max_lora_rank=8)
    eager = _greedy(_llm(model_dir, enforce_eager=True, **kw), lora_request=per_prompt)
    llm = _llm(model_dir, **kw)
    graphs = padded(llm.engine, (1, 2, 4, 8))
    assert _greedy(llm, lora_request=per_prompt) == eager
    assert graphs.replays[(5, 8)] > 0


def test_speculative_guesses_are_not_plain_decodes(model_dir: Path) -> None:
    """A step verifying n-gram guesses lays chunks out as decode rows: it runs eagerly."""
    prompt = [7, 8, 9, 10] * 6
    p = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    eager = _llm(model_dir, enforce_eager=True, speculative_method="ngram")
    want = eager.generate([prompt], p)[0].token_ids
    llm = _llm(model_dir, speculative_method="ngram")
    graphs = padded(llm.engine, (1, 2, 4, 8))
    assert llm.generate([prompt], p)[0].token_ids == want
    assert llm.engine.speculator is not None
    assert llm.engine.speculator.stats.proposed > 0  # guesses were verified, eagerly
    assert sum(graphs.replays.values()) < 16


class _Model:
    def __init__(self, triton: bool, linear: bool = False) -> None:
        self.triton_ops = [object()] if triton else None
        self.config = SimpleNamespace(linear=object() if linear else None)


@pytest.mark.parametrize(
    ("setting", "device", "triton", "pipelined", "reason"),
    [
        ({"enforce_eager": True}, "cuda", True, False, "enforce_eager"),
        ({}, "cpu", True, False, "cpu"),
        ({"role": "prefill"}, "cuda", True, False, "prefill_role"),
        ({}, "cuda", False, False, "attention_backend_torch"),
        ({}, "cuda", True, True, "pipeline_parallel"),
        ({"role": "decode"}, "cuda", True, False, None),
        ({}, "cuda", True, False, None),
    ],
)
def test_eager_reasons(
    model_dir: Path,
    setting: dict[str, Any],
    device: str,
    triton: bool,
    pipelined: bool,
    reason: str | None,
) -> None:
    model: Any = _Model(triton)
    config = EngineConfig(model_dir, **setting)  # the device is eager_reason's argument
    assert eager_reason(config, torch.device(device), model, pipelined) == reason


def test_a_hybrid_model_runs_eagerly(model_dir: Path) -> None:
    """Its linear-attention states are read and written per sequence on the host."""
    model: Any = _Model(True, linear=True)
    config = EngineConfig(model_dir)
    assert eager_reason(config, torch.device("cuda"), model, False) == "linear_attention"


def test_the_cpu_runs_eagerly_and_says_why(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="engine.step.graphs"):
        engine = LLMEngine(EngineConfig(model_dir, num_kv_blocks=16))
    assert engine.runner.graphs is None and engine.runner._graph_estimate() is None
    assert "cuda_graphs off reason=cpu" in caplog.text


def test_enforce_eager_is_an_engine_setting(model_dir: Path) -> None:
    assert EngineConfig(model_dir).enforce_eager is False
    assert EngineConfig(model_dir, enforce_eager=True).enforce_eager is True


# ---- on a GPU ---------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_replay_gives_the_eager_tokens_on_the_oracle_prompts(
    default_model_dir: Path, kv_cache_dtype: str
) -> None:
    """float32: the graphs' attention splits its keys differently from the eager step's
    (planned for the longest context), so only fp32 sums are close enough for greedy
    tokens to be the same bits of evidence; bfloat16 agreement is a figure of the GPU check."""
    from oracle_runs import logprob_greedy

    kw: dict[str, Any] = dict(device="cuda", dtype="float32", kv_cache_dtype=kv_cache_dtype)
    eager = logprob_greedy(default_model_dir, enforce_eager=True, **kw)
    graphs = logprob_greedy(default_model_dir, **kw)
    assert [o.token_ids for o in graphs.outputs] == [o.token_ids for o in eager.outputs]
    assert graphs.free_after == graphs.free_before


@pytest.mark.gpu
@needs_cuda
def test_replay_with_lora_on_cuda(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from lora_adapters import make_adapter

    root = tmp_path_factory.mktemp("graph_lora_cuda")
    lora = LoRARequest("a0", 1, make_adapter(model_dir, root / "a0", seed=0))
    per_prompt = [lora, None, lora, None, lora]
    kw: dict[str, Any] = dict(enable_lora=True, max_loras=2, max_lora_rank=8, dtype="float32")
    eager = _greedy(_llm(model_dir, enforce_eager=True, **kw), lora_request=per_prompt)
    llm = _llm(model_dir, async_scheduling=True, **kw)
    graphs = llm.engine.runner.graphs
    assert graphs is not None and graphs.sizes == (1, 2, 4, 8)
    assert _greedy(llm, lora_request=per_prompt) == eager


@pytest.mark.gpu
@needs_cuda
def test_a_replayed_step_launches_a_few_kernels_from_the_host(default_model_dir: Path) -> None:
    """The host's launch calls of one decode step of 4 rows of the default model (30 layers):
    eager, one per kernel; replayed, the input copies, one graph launch and the sampler."""
    from bench.launches import count_launches

    counts = {}
    for eager in (True, False):
        llm = LLM(default_model_dir, device="cuda", num_kv_blocks=64, enforce_eager=eager)
        engine = llm.engine
        p = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
        for i, prompt in enumerate(PROMPTS[:4]):
            engine.add_request(f"r{i}", prompt, p)
        while len(engine.step()) < 4:
            pass
        engine.step()  # the first all-decode step
        counts[eager] = count_launches(engine.step)
        llm.close()
    assert counts[False].host_calls < counts[True].host_calls / 4, counts
    assert counts[False].kernels > 0


@pytest.mark.gpu
@needs_cuda
def test_the_kv_plan_keeps_room_for_the_graphs(model_dir: Path) -> None:
    """Sized by gpu_memory_utilization, the plan's estimate (the largest and the smallest
    graph captured against a scratch block) covers what the capture then took."""
    llm = _llm(model_dir, num_kv_blocks=None, gpu_memory_utilization=0.2, dtype="float32")
    runner = llm.engine.runner
    assert runner.memory is not None and runner.graphs is not None
    captured = runner.graphs.captured
    assert captured is not None and captured.graphs == 4
    assert 0 < captured.memory_bytes <= runner.memory.graphs + (64 << 20)


def _engine_greedy(model_dir: Path, **kw: Any) -> list[list[int]]:
    """Greedy tokens of PROMPTS straight through an engine (the model needs no tokenizer)."""
    config = EngineConfig(
        model_dir, device="cuda", block_size=4, num_kv_blocks=96, max_num_seqs=8,
        max_num_batched_tokens=32, **kw,
    )  # fmt: skip
    engine = LLMEngine(config)
    tokens: dict[str, list[int]] = {}
    for i, prompt in enumerate(PROMPTS):
        tokens[f"r{i}"] = []
        engine.add_request(f"r{i}", prompt, params(i))
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    engine.close()
    return list(tokens.values())


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "gemma2", "gemma3", "qwen2_window"])
def test_replay_of_each_kind_of_layer_on_cuda(tmp_path: Path, family: str) -> None:
    """Experts (routed on the device), sliding windows, soft-caps and a second rotary table
    inside the graphs give the eager tokens (float32)."""
    from tests.engine.model.tiny_families import save_family

    save_family(family, tmp_path / family)
    eager = _engine_greedy(tmp_path / family, enforce_eager=True)
    assert _engine_greedy(tmp_path / family) == eager
