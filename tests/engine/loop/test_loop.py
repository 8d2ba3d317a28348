"""EngineLoop: the thread that owns an engine delivers outputs, aborts free blocks, an
engine failure ends the streams instead of hanging them, an idle loop sleeps, and an idle
loop writes the KV blocks a request left to the disk tier without another step."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import tier_driver
import torch
from tiny_llama import save_tiny_llama

import engine.loop.engine_loop as engine_loop
from engine.config import EngineConfig, Role, engine_config
from engine.engine import LLMEngine
from engine.loop.engine_loop import EngineLoop
from engine.loop.stream import EngineFailed, RequestStream
from engine.scheduler.request import FinishReason
from models.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
LONG = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
PROMPTS = [[5, 9, 17, 33, 4, 8, 12], [7, 7, 3, 90, 44]]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(path)
    return path


def _engine(model_dir: Path, role: Role = Role.COLOCATED) -> LLMEngine:
    torch.set_num_threads(1)
    config = EngineConfig(model_dir=model_dir, block_size=4, num_kv_blocks=64, role=role)
    return LLMEngine(config)


@pytest.fixture
async def loop(tiny_dir: Path) -> AsyncIterator[EngineLoop]:
    engine_loop = EngineLoop(_engine(tiny_dir), torch_threads=1)
    engine_loop.start()
    yield engine_loop
    engine_loop.stop()


def _offline(model_dir: Path, prompt: list[int], params: SamplingParams) -> list[int]:
    engine = _engine(model_dir)
    engine.add_request("x", prompt, params)
    tokens: list[int] = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens.extend(out.new_token_ids)
    return tokens


async def _collect(stream: RequestStream) -> tuple[list[int], FinishReason | None]:
    tokens: list[int] = []
    while True:
        item = await stream.get(timeout_s=30)
        tokens.extend(item.output.new_token_ids)
        if item.output.finished:
            return tokens, item.output.finish_reason


async def _open(
    loop: EngineLoop, rid: str, prompt: list[int], params: SamplingParams
) -> RequestStream:
    return await loop.open(rid, lambda e: e.add_request(rid, prompt, params))


async def _free_blocks(loop: EngineLoop) -> tuple[int, int]:
    stats = await loop.call(lambda e: e.stats())
    return stats.free_blocks, stats.total_blocks


async def test_outputs_match_the_engine_run_directly(loop: EngineLoop, tiny_dir: Path) -> None:
    for i, prompt in enumerate(PROMPTS):
        tokens, reason = await _collect(await _open(loop, f"r{i}", prompt, GREEDY))
        assert tokens == _offline(tiny_dir, prompt, GREEDY)
        assert reason is FinishReason.LENGTH


async def test_concurrent_requests_all_finish_and_free_their_blocks(loop: EngineLoop) -> None:
    streams = [await _open(loop, f"c{i}", PROMPTS[i % 2], GREEDY) for i in range(6)]
    results = await asyncio.gather(*(_collect(s) for s in streams))
    assert all(len(tokens) == GREEDY.max_tokens for tokens, _ in results)
    free, total = await _free_blocks(loop)
    assert free == total
    assert loop.snapshot.counters.finished_requests >= 6


async def test_abort_ends_the_stream_and_frees_the_blocks(loop: EngineLoop) -> None:
    stream = await _open(loop, "long", PROMPTS[0], LONG)
    first = await stream.get(timeout_s=30)
    assert first.output.new_token_ids
    assert await loop.abort("long") is True
    stats = loop.snapshot.stats  # up to date once the command returned
    assert stats.free_blocks == stats.total_blocks and stats.running == 0
    _, reason = await _collect(stream)
    assert reason is FinishReason.ABORT
    assert await loop.abort("long") is False  # idempotent


async def test_bad_requests_raise_and_leave_nothing_behind(loop: EngineLoop) -> None:
    with pytest.raises(ValueError, match="context length"):
        await _open(loop, "big", [3] * 300, GREEDY)
    stream = await _open(loop, "dup", PROMPTS[0], LONG)
    with pytest.raises(ValueError, match="already in use"):
        await _open(loop, "dup", PROMPTS[1], GREEDY)
    await loop.abort("dup")
    await _collect(stream)
    free, total = await _free_blocks(loop)
    assert free == total


async def test_cancelled_open_aborts_the_request(loop: EngineLoop) -> None:
    def slow_add(engine: LLMEngine) -> None:
        time.sleep(0.2)  # the caller is cancelled while this runs
        engine.add_request("cancelled", PROMPTS[0], LONG)

    task = asyncio.create_task(loop.open("cancelled", slow_add))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):
        stats = await loop.call(lambda e: e.stats())
        if stats.running == 0 and stats.waiting == 0:
            break
        await asyncio.sleep(0.02)
    free, total = await _free_blocks(loop)
    assert (stats.running, free) == (0, total)


async def test_engine_failure_ends_streams_with_an_error(
    loop: EngineLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: object) -> torch.Tensor:
        raise RuntimeError("kernel exploded")

    stream = await _open(loop, "doomed", PROMPTS[0], LONG)
    await stream.get(timeout_s=30)
    monkeypatch.setattr(loop.engine.runner, "forward", broken)
    with pytest.raises(EngineFailed, match="kernel exploded"):
        await _collect(stream)
    monkeypatch.undo()
    free, total = await _free_blocks(loop)
    assert free == total
    tokens, _ = await _collect(await _open(loop, "after", PROMPTS[1], GREEDY))
    assert len(tokens) == GREEDY.max_tokens  # the loop survives


async def test_prefill_role_reports_the_pinned_blocks(tiny_dir: Path) -> None:
    engine_loop = EngineLoop(_engine(tiny_dir, Role.PREFILL), torch_threads=1)
    engine_loop.start()
    try:
        stream = await _open(engine_loop, "p", PROMPTS[0], GREEDY)
        item = await stream.get(timeout_s=30)
        assert item.output.finished and item.output.finish_reason is FinishReason.PREFILLED
        assert len(item.pinned_block_ids) == 2  # 7 prompt tokens in blocks of 4
        free, total = await _free_blocks(engine_loop)
        assert free == total - 2
        assert await engine_loop.call(lambda e: e.release("p"))
        free, total = await _free_blocks(engine_loop)
        assert free == total
    finally:
        engine_loop.stop()


async def test_idle_loop_does_not_spin(loop: EngineLoop) -> None:
    await _collect(await _open(loop, "warm", PROMPTS[0], GREEDY))
    before = time.process_time()
    await asyncio.sleep(0.5)
    assert time.process_time() - before < 0.1  # a busy loop would burn ~0.5 s


@pytest.mark.parametrize("role", [Role.PREFILL, Role.COLOCATED])
async def test_an_idle_loop_writes_the_blocks_a_request_left_to_disk(
    tiny_dir: Path, tmp_path: Path, role: Role
) -> None:
    """No other request comes after it: its blocks are on disk and the snapshot counts them
    all the same (the tiers' numbers show from the start)."""
    tiers = {
        "kv_offload_cpu_gb": tier_driver.gib(64),
        "kv_offload_disk_path": tmp_path,
        "kv_offload_disk_gb": tier_driver.disk_gib(64),
    }
    engine = tier_driver.engine(tiny_dir, num_kv_blocks=64, role=role, **tiers)
    engine_loop = EngineLoop(engine, torch_threads=1)
    engine_loop.start()
    try:
        start = engine_loop.snapshot.counters.kv_tiers
        assert start["disk_capacity_blocks"] == 64 and start["disk_bytes_in"] == 0
        prompt = tier_driver.prompt(3, 40)
        await _collect(await _open(engine_loop, "r", prompt, GREEDY))
        if role is Role.PREFILL:  # its blocks leave the device when the decode side read them
            assert await engine_loop.call(lambda e: e.release("r"))
        computed = len(prompt) + (GREEDY.max_tokens - 1 if role is Role.COLOCATED else 0)
        blocks = computed // tier_driver.BS
        written = blocks * engine.runner.layout.block_bytes
        deadline = time.monotonic() + 30
        while engine_loop.snapshot.counters.kv_tiers["disk_bytes_in"] < written:
            assert time.monotonic() < deadline, engine_loop.snapshot.counters.kv_tiers
            await asyncio.sleep(0.02)
        assert len(list(tmp_path.glob("*.kvb"))) == blocks
    finally:
        engine_loop.stop()


async def test_stop_fails_open_streams_and_refuses_commands(tiny_dir: Path) -> None:
    engine_loop = EngineLoop(_engine(tiny_dir), torch_threads=1)
    engine_loop.start()
    stream = await _open(engine_loop, "orphan", PROMPTS[0], LONG)
    await stream.get(timeout_s=30)
    await asyncio.to_thread(engine_loop.stop)
    assert not engine_loop.running
    with pytest.raises(EngineFailed):
        await _collect(stream)
    with pytest.raises(EngineFailed, match="not running"):
        await engine_loop.call(lambda e: e.stats())


def test_torch_threads_must_be_positive(tiny_dir: Path) -> None:
    with pytest.raises(ValueError, match="torch_threads"):
        EngineLoop(_engine(tiny_dir), torch_threads=0)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_engine_config_resolves_auto_and_drops_unset_options(tiny_dir: Path) -> None:
    config = engine_config(tiny_dir, role="prefill", num_kv_blocks=None, max_num_seqs=3)
    want_device = "cuda" if torch.cuda.is_available() else "cpu"
    assert str(config.device) == want_device
    assert config.torch_dtype == (torch.bfloat16 if want_device == "cuda" else torch.float32)
    assert (config.role, config.num_kv_blocks, config.max_num_seqs) == (Role.PREFILL, None, 3)


async def test_launch_builds_the_engine_in_a_thread_that_ends(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine is built in a thread that is gone once launch returns (not a pooled
    executor thread that would keep an OpenMP pool beside the loop's), and a failed build
    raises at the caller."""

    builders: list[threading.Thread] = []

    class Recording(LLMEngine):
        def __init__(self, config: EngineConfig) -> None:
            builders.append(threading.current_thread())
            super().__init__(config)

    monkeypatch.setattr(engine_loop, "LLMEngine", Recording)
    config = EngineConfig(model_dir=tiny_dir, block_size=4, num_kv_blocks=64)
    loop = await EngineLoop.launch(config, torch_threads=1)
    try:
        assert len(builders) == 1 and builders[0] is not threading.main_thread()
        assert not builders[0].is_alive()
        stream = await loop.open("r", lambda e: e.add_request("r", PROMPTS[0], GREEDY))
        assert (await _collect(stream))[0] == _offline(tiny_dir, PROMPTS[0], GREEDY)
    finally:
        loop.stop()
    bad = EngineConfig(model_dir=tiny_dir / "missing", block_size=4, num_kv_blocks=64)
    with pytest.raises(Exception, match="missing"):
        await EngineLoop.launch(bad, torch_threads=1)
