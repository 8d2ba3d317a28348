"""Scheduler on plain numbers: a fake sampler stands in for the model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig, Role
from engine.kv.block_manager import BlockManager
from engine.scheduler.plan import ImportPlan, RequestTooLargeError, SchedulerOutput, StepUpdate
from engine.scheduler.request import FinishReason, Request, RequestStatus
from engine.scheduler.scheduler import Scheduler
from models.sampling_params import SamplingParams

BS = 4


def fake_token(request: Request) -> int:
    """Deterministic 'model': the next token depends on the request and its length only."""
    return 1000 + (sum(map(ord, request.request_id)) * 31 + request.num_known_tokens) % 5000


@dataclass
class Sim:
    """Scheduler + block manager + fake sampler, checking invariants every step."""

    scheduler: Scheduler
    blocks: BlockManager
    config: EngineConfig
    sampler: Callable[[Request], int] = fake_token
    requests: list[Request] = field(default_factory=list)
    outputs: list[SchedulerOutput] = field(default_factory=list)

    def add(self, request: Request) -> None:
        self.scheduler.add(request)
        self.requests.append(request)

    def add_prefilled(self, request: Request, tokens: list[int]) -> ImportPlan | None:
        plan = self.scheduler.add_prefilled(request, tokens)
        if plan is not None:
            self.requests.append(request)
        return plan

    def step(self) -> tuple[SchedulerOutput, StepUpdate]:
        running = {r.request_id for r in self.requests if r.status is RequestStatus.RUNNING}
        out = self.scheduler.schedule()
        self.check(out)
        if out.preempted:  # no admission while short of blocks
            assert {c.request_id for c in out.chunks} <= running
        sampled = {}
        for chunk in out.chunks:
            request = self.scheduler.get(chunk.request_id)
            assert request is not None
            if chunk.sample:
                sampled[chunk.request_id] = self.sampler(request)
        self.outputs.append(out)
        update = self.scheduler.update(out, sampled)
        self.scheduler.audit()
        return out, update

    def check(self, out: SchedulerOutput) -> None:
        assert out.num_tokens <= self.config.max_num_batched_tokens
        assert len(out.chunks) <= self.config.max_num_seqs
        assert self.scheduler.num_running <= self.config.max_num_seqs
        assert len({c.request_id for c in out.chunks}) == len(out.chunks)
        for chunk in out.chunks:
            request = self.scheduler.get(chunk.request_id)
            assert request is not None and request.status is RequestStatus.RUNNING
            assert chunk.num_tokens > 0
            assert chunk.context_len == request.num_computed_tokens  # advanced by schedule()
            assert list(chunk.token_ids) == request.all_token_ids[chunk.start : chunk.context_len]
            assert len(chunk.block_table) * BS >= chunk.context_len
            assert chunk.sample == (chunk.context_len == request.num_known_tokens)
            assert request.num_pending == chunk.sample
        self.scheduler.audit()

    def run(self, max_steps: int = 10_000) -> int:
        steps = 0
        while self.scheduler.has_work:
            self.step()
            steps += 1
            assert steps < max_steps, "no progress"
        return steps


def make_sim(role: Role = Role.COLOCATED, num_blocks: int = 64, **overrides: Any) -> Sim:
    settings: dict[str, Any] = {
        "block_size": BS,
        "num_kv_blocks": num_blocks,
        "max_num_batched_tokens": 32,
        "max_num_seqs": 8,
        "role": role,
        **overrides,
    }
    config = EngineConfig(model_dir=Path("unused"), **settings)
    blocks = BlockManager(num_blocks, BS, config.enable_prefix_caching)
    return Sim(Scheduler(config, blocks), blocks, config)


def make_request(rid: str, prompt_len: int, max_tokens: int = 4, base: int = 0) -> Request:
    prompt = [base + (i * 7 + len(rid)) % 900 for i in range(prompt_len)]
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens))


def expected_outputs(request: Request, max_tokens: int) -> list[int]:
    probe = Request("x", list(request.prompt_token_ids), request.params)
    probe.request_id = request.request_id
    for _ in range(max_tokens):
        probe.output_token_ids.append(fake_token(probe))
    return probe.output_token_ids


def test_everything_completes_and_blocks_return() -> None:
    sim = make_sim()
    requests = [make_request(f"r{i}", 5 + 3 * i, max_tokens=6) for i in range(6)]
    for request in requests:
        sim.add(request)
    sim.run()
    for request in requests:
        assert request.status is RequestStatus.FINISHED
        assert request.finish_reason is FinishReason.LENGTH
        assert request.output_token_ids == expected_outputs(request, 6)
    assert sim.blocks.num_free_blocks == sim.blocks.num_total_blocks


def test_chunked_prefill_splits_a_long_prompt_within_the_budget() -> None:
    sim = make_sim(max_num_batched_tokens=16)
    request = make_request("long", 50, max_tokens=2)
    sim.add(request)
    sizes = []
    for _ in range(4):
        out, _ = sim.step()
        (chunk,) = out.chunks
        sizes.append((chunk.num_tokens, chunk.sample))
    assert sizes == [(16, False), (16, False), (16, False), (2, True)]
    assert request.output_token_ids == expected_outputs(request, 1)


def test_decodes_come_first_and_prefills_fill_the_rest() -> None:
    sim = make_sim(max_num_batched_tokens=8)
    short = make_request("short", 3, max_tokens=10)
    sim.add(short)
    sim.step()  # prefill of `short`, token 1
    sim.add(make_request("long", 30))
    out, _ = sim.step()
    assert [(c.request_id, c.num_tokens) for c in out.chunks] == [("short", 1), ("long", 7)]
    out, _ = sim.step()
    assert [(c.request_id, c.num_tokens) for c in out.chunks] == [("short", 1), ("long", 7)]


def test_admission_is_fifo_and_capped_by_max_num_seqs() -> None:
    sim = make_sim(max_num_seqs=2)
    for i in range(4):
        sim.add(make_request(f"r{i}", 3, max_tokens=3))
    out, _ = sim.step()
    assert [c.request_id for c in out.chunks] == ["r0", "r1"]
    assert sim.scheduler.num_running == 2 and sim.scheduler.num_waiting == 2
    sim.run()
    assert sim.blocks.num_free_blocks == sim.blocks.num_total_blocks


def test_without_chunked_prefill_a_prompt_waits_for_room_in_the_budget() -> None:
    sim = make_sim(max_num_batched_tokens=10, enable_chunked_prefill=False)
    sim.add(make_request("a", 6))
    sim.add(make_request("b", 6, base=100))
    out, _ = sim.step()
    assert [(c.request_id, c.num_tokens) for c in out.chunks] == [("a", 6)]
    out, _ = sim.step()
    assert [(c.request_id, c.num_tokens) for c in out.chunks] == [("a", 1), ("b", 6)]


def test_preemption_under_pressure_recomputes_and_everything_completes() -> None:
    sim = make_sim(num_blocks=10, max_num_batched_tokens=64)
    requests = [make_request(f"r{i}", 9, max_tokens=12) for i in range(4)]
    for request in requests:
        sim.add(request)
    sim.run()
    preempted = [rid for out in sim.outputs for rid in out.preempted]
    assert preempted, "10 blocks of 4 cannot hold four 21-token sequences"
    assert preempted[0] == "r3"  # the most recently arrived goes first
    for request in requests:
        assert request.output_token_ids == expected_outputs(request, 12)
    assert sum(r.num_preemptions for r in requests) == len(preempted)
    assert sim.blocks.num_free_blocks == sim.blocks.num_total_blocks


def test_a_preempted_request_recomputes_its_generated_tokens() -> None:
    sim = make_sim(num_blocks=6, max_num_batched_tokens=64, enable_prefix_caching=False)
    old = make_request("old", 8, max_tokens=12)
    new = make_request("new", 7, max_tokens=12)
    sim.add(old)
    sim.add(new)
    while not new.num_preemptions:
        sim.step()
    assert new.status is RequestStatus.WAITING and new.block_ids == []
    assert new.num_computed_tokens == 0 and new.output_token_ids
    while sim.scheduler.get("new") is not None and new.status is RequestStatus.WAITING:
        sim.step()
    recompute = next(c for c in sim.outputs[-1].chunks if c.request_id == "new")
    assert recompute.start == 0 and recompute.sample
    assert list(recompute.token_ids) == new.all_token_ids[: recompute.num_tokens]
    assert recompute.num_tokens > new.num_prompt_tokens  # generated tokens recomputed too
    sim.run()
    assert new.output_token_ids == expected_outputs(new, 12)


def test_the_newest_request_preempts_itself() -> None:
    sim = make_sim(num_blocks=4, max_num_batched_tokens=64, enable_prefix_caching=False)
    old = make_request("old", 8, max_tokens=4)  # 2 blocks, grows to a third
    new = make_request("new", 8, max_tokens=4)
    sim.add(old)
    sim.add(new)
    sim.step()  # both prefilled: 4 blocks, none free
    out, _ = sim.step()  # both need a new block for position 8
    assert out.preempted == ("new",)
    assert [c.request_id for c in out.chunks] == ["old"]
    sim.run()
    assert old.output_token_ids == expected_outputs(old, 4)
    assert new.output_token_ids == expected_outputs(new, 4)


def test_a_preempted_request_goes_back_to_the_front_of_the_queue() -> None:
    sim = make_sim(
        num_blocks=4, max_num_batched_tokens=5, max_num_seqs=2, enable_prefix_caching=False
    )
    old = make_request("old", 4, max_tokens=6)
    new = make_request("new", 4, max_tokens=6)
    later = make_request("later", 4, max_tokens=1)
    for request in (old, new, later):
        sim.add(request)
    while not new.num_preemptions:
        out, _ = sim.step()
    assert out.preempted == ("new",)
    # Budget was left, and a 4-token chunk of `new` would fit a freed block: not admitted
    # in the step that preempted it (no thrashing), and it is readmitted before `later`.
    assert [c.request_id for c in out.chunks] == ["old"]
    sim.run()
    start = len(sim.outputs) - sim.outputs[::-1].index(out)
    admitted = [c.request_id for o in sim.outputs[start:] for c in o.chunks if c.start == 0]
    assert admitted.index("new") < admitted.index("later")
    assert new.output_token_ids == expected_outputs(new, 6)


def test_prefix_cache_hit_at_admission_skips_cached_tokens() -> None:
    sim = make_sim()
    first = make_request("a", 14, max_tokens=2)
    sim.add(first)
    sim.run()
    second = Request("b", [*first.prompt_token_ids[:12], 1, 2, 3], SamplingParams(max_tokens=2))
    sim.add(second)
    out, _ = sim.step()
    (chunk,) = out.chunks
    assert chunk.start == 12 and chunk.num_tokens == 3
    assert second.num_cached_tokens == 12
    assert sim.blocks.num_prefix_hit_tokens == 12
    sim.run()
    assert sim.blocks.num_free_blocks == sim.blocks.num_total_blocks


def test_a_request_larger_than_the_cache_is_refused() -> None:
    sim = make_sim(num_blocks=4)
    with pytest.raises(RequestTooLargeError, match="holds at most 16"):
        sim.add(make_request("big", 17))
    with pytest.raises(ValueError, match="already in use"):
        sim.add(make_request("dup", 3))
        sim.add(make_request("dup", 3))


def test_a_request_growing_past_the_cache_finishes_with_length() -> None:
    sim = make_sim(num_blocks=4)
    request = make_request("grow", 10, max_tokens=100)
    sim.add(request)
    sim.run()
    assert request.finish_reason is FinishReason.LENGTH
    assert request.num_tokens == 17  # 16 tokens of KV, plus the last sampled one
    assert sim.blocks.num_free_blocks == 4


def test_abort_frees_blocks_in_any_state_and_mid_step() -> None:
    sim = make_sim(max_num_seqs=1)
    running = make_request("run", 9)
    waiting = make_request("wait", 9)
    sim.add(running)
    sim.add(waiting)
    sim.step()
    assert sim.scheduler.abort("wait") and waiting.finish_reason is FinishReason.ABORT
    out = sim.scheduler.schedule()
    assert sim.scheduler.abort("run")  # between schedule() and update()
    assert sim.scheduler.update(out, {"run": 5}).advanced == ()
    assert running.status is RequestStatus.FINISHED and running.block_ids == []
    assert not sim.scheduler.abort("run") and not sim.scheduler.abort("nobody")
    assert sim.blocks.num_free_blocks == sim.blocks.num_total_blocks
    assert not sim.scheduler.has_work


def test_updates_take_the_scheduled_steps_in_order() -> None:
    sim = make_sim()
    sim.add(make_request("a", 3))
    first = sim.scheduler.schedule()
    second = sim.scheduler.schedule()  # planned while the first runs: decodes the pending token
    assert [(c.start, c.num_tokens) for c in first.chunks] == [(0, 3)]
    assert second.decode_starts == (3,) and not second.prefills
    with pytest.raises(RuntimeError, match="oldest"):
        sim.scheduler.update(second, {"a": 1})
    sim.scheduler.update(first, {"a": 7})
    assert [(c.token_ids, c.start) for c in second.chunks] == [((7,), 3)]
    sim.scheduler.update(second, {"a": 8})
    assert sim.requests[0].output_token_ids == [7, 8]


def test_prefill_role_pins_after_the_first_token_until_released() -> None:
    sim = make_sim(role=Role.PREFILL)
    pinned = make_request("p", 10, max_tokens=8)
    one_token = make_request("one", 5, max_tokens=1)
    sim.add(pinned)
    sim.add(one_token)
    _, update = sim.step()
    assert {r.request_id for r in update.finished} == {"p", "one"}
    assert pinned.status is RequestStatus.PINNED
    assert pinned.finish_reason is FinishReason.PREFILLED
    assert len(pinned.output_token_ids) == 1 and len(pinned.block_ids) == 3
    assert one_token.status is RequestStatus.FINISHED and one_token.block_ids == []
    assert sim.scheduler.num_pinned == 1 and not sim.scheduler.has_work
    assert sim.blocks.num_free_blocks == sim.blocks.num_total_blocks - 3
    assert sim.scheduler.release("p") and not sim.scheduler.release("p")
    assert pinned.status is RequestStatus.FINISHED and pinned.block_ids == []
    assert sim.blocks.num_free_blocks == sim.blocks.num_total_blocks


def test_abort_frees_a_pinned_request() -> None:
    sim = make_sim(role=Role.PREFILL)
    sim.add(make_request("p", 10))
    sim.step()
    assert sim.scheduler.abort("p")
    assert sim.scheduler.num_pinned == 0
    assert sim.blocks.num_free_blocks == sim.blocks.num_total_blocks


def test_decode_role_imports_then_decodes() -> None:
    sim = make_sim(role=Role.DECODE)
    request = make_request("d", 8, max_tokens=5)
    plan = sim.add_prefilled(request, [4242])
    assert plan is not None
    assert len(plan.block_ids) == 3  # 8 prompt tokens + the slot of the first token
    assert plan.num_cached_tokens == 0 and plan.num_kv_tokens == 8
    assert plan.fill_block_ids == plan.block_ids[:2]
    assert sim.scheduler.num_importing == 1 and not sim.scheduler.has_work
    assert sim.scheduler.schedule().is_empty
    assert sim.scheduler.commit_prefilled("d") is request
    assert request.num_computed_tokens == 8 and request.output_token_ids == [4242]
    out, _ = sim.step()
    (chunk,) = out.chunks
    assert (chunk.start, chunk.token_ids, chunk.sample) == (8, (4242,), True)
    sim.run()
    assert len(request.output_token_ids) == 5
    assert sim.blocks.num_free_blocks == sim.blocks.num_total_blocks


def test_decode_role_reuses_local_prefix_blocks() -> None:
    sim = make_sim(role=Role.DECODE)
    local = make_request("local", 13, max_tokens=1)
    sim.add(local)
    sim.run()  # leaves 3 full prompt blocks in the prefix cache
    imported = Request("imp", [*local.prompt_token_ids[:12], 5, 6], SamplingParams())
    plan = sim.add_prefilled(imported, [77])
    assert plan is not None
    assert plan.num_cached_tokens == 12 and plan.num_cached_blocks == 3
    assert plan.fill_block_ids == plan.block_ids[3:4]
    sim.scheduler.commit_prefilled("imp")
    assert imported.num_cached_tokens == 12 and imported.num_computed_tokens == 14


def test_decode_role_import_without_room_and_abort_while_importing() -> None:
    sim = make_sim(role=Role.DECODE, num_blocks=4)
    first = make_request("a", 8)
    assert sim.add_prefilled(first, [1]) is not None  # 3 blocks
    second = make_request("b", 8)
    assert sim.add_prefilled(second, [1]) is None
    assert second.block_ids == [] and sim.scheduler.get("b") is None
    assert sim.scheduler.abort("a")
    assert sim.scheduler.commit_prefilled("a") is None
    assert sim.blocks.num_free_blocks == 4
    assert sim.add_prefilled(second, [1]) is not None


def test_decode_role_first_token_can_finish_the_request() -> None:
    sim = make_sim(role=Role.DECODE)
    request = make_request("d", 8, max_tokens=1)
    assert sim.add_prefilled(request, [9]) is not None
    assert sim.scheduler.commit_prefilled("d") is request
    assert request.finish_reason is FinishReason.LENGTH
    assert sim.blocks.num_free_blocks == sim.blocks.num_total_blocks


def test_add_prefilled_needs_the_decode_role() -> None:
    sim = make_sim(role=Role.COLOCATED)
    with pytest.raises(RuntimeError, match="role=decode"):
        sim.add_prefilled(make_request("d", 8), [1])


def test_block_size_mismatch_is_refused() -> None:
    config = EngineConfig(model_dir=Path("unused"), block_size=16)
    with pytest.raises(ValueError, match="block_size"):
        Scheduler(config, BlockManager(8, 4, True))


# ---- property test ---------------------------------------------------------------------------

EOS = 3
SHARED = ([5, 1, 2, 6, 0, 4, 7, 1] * 3, [2, 2, 4, 0, 1, 6, 5, 5] * 3)  # common prefixes
_add = st.tuples(
    st.just("add"),
    st.sampled_from([(), *SHARED]),
    st.integers(0, 20),  # how much of the shared prefix
    st.lists(st.integers(0, 7), max_size=16),
    st.integers(1, 16),  # max_tokens
)
_abort = st.tuples(st.just("abort"), st.integers(0, 30))
_release = st.tuples(st.just("release"), st.integers(0, 30))
_step = st.tuples(st.just("step"))


def small_token(request: Request) -> int:
    """A 'model' over 16 tokens, EOS included, still a function of (request, position)."""
    return fake_token(request) % 16


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],  # no slow explain
)
@given(
    num_blocks=st.integers(6, 16),
    budget=st.integers(1, 24),
    max_num_seqs=st.integers(1, 5),
    chunked=st.booleans(),
    caching=st.booleans(),
    role=st.sampled_from([Role.COLOCATED, Role.PREFILL]),
    actions=st.lists(
        st.one_of(_add, _add, _abort, _release, _step, _step), min_size=10, max_size=40
    ),
)
def test_random_traffic_keeps_every_invariant(
    num_blocks: int,
    budget: int,
    max_num_seqs: int,
    chunked: bool,
    caching: bool,
    role: Role,
    actions: list[tuple[Any, ...]],
) -> None:
    sim = make_sim(
        role=role,
        num_blocks=num_blocks,
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=caching,
    )
    sim.sampler = small_token
    requests = sim.requests

    def step() -> None:
        out, _ = sim.step()
        if out.preempted:
            event("preemption")

    for action in actions:
        if action[0] == "add":
            prompt = ([*action[1][: action[2]], *action[3]] or [1])[: num_blocks * BS]
            request = Request(
                f"r{len(requests)}",
                prompt,
                SamplingParams(max_tokens=action[4]),
                eos_token_ids=frozenset({EOS}),
            )
            requests.append(request)
            sim.add(request)
        elif action[0] == "abort" and requests:
            sim.scheduler.abort(requests[action[1] % len(requests)].request_id)
        elif action[0] == "release" and requests:
            sim.scheduler.release(requests[action[1] % len(requests)].request_id)
        else:
            step()
        sim.scheduler.audit()

    for _ in range(2000):  # drain; pinned blocks are released as an expired lease would
        for request in requests:
            sim.scheduler.release(request.request_id)
        if not sim.scheduler.has_work:
            break
        step()
    assert not sim.scheduler.has_work, "requests left unfinished"
    if sim.blocks.num_prefix_hit_tokens:
        event("prefix hit")
    if any(r.finish_reason is FinishReason.STOP for r in requests):
        event("stopped by EOS")
    for request in requests:
        sim.scheduler.release(request.request_id)
        assert request.status is RequestStatus.FINISHED
        assert request.block_ids == []
        _check_outputs(request, role, sim.blocks.num_total_blocks * BS)
    assert sim.scheduler.num_pinned == sim.scheduler.num_running == 0
    assert sim.blocks.num_free_blocks == sim.blocks.num_total_blocks
    sim.scheduler.audit()


def _check_outputs(request: Request, role: Role, capacity: int) -> None:
    """Each generated token is the 'model' output for its position, despite preemptions."""
    probe = Request(request.request_id, list(request.prompt_token_ids), request.params)
    for token in request.output_token_ids:
        assert token == small_token(probe)
        probe.output_token_ids.append(token)
    if request.finish_reason is FinishReason.ABORT:
        return
    outputs = request.output_token_ids
    if role is Role.PREFILL and request.finish_reason is FinishReason.PREFILLED:
        assert len(outputs) == 1
    elif request.finish_reason is FinishReason.STOP:
        assert outputs[-1] == EOS
    else:
        assert request.finish_reason is FinishReason.LENGTH
        assert len(outputs) == request.params.max_tokens or request.num_tokens > capacity
