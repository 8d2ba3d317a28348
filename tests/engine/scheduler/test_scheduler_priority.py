"""Priorities in the scheduler: the waiting queue serves (priority, arrival) in order, and
under KV pressure the lowest-priority running request is preempted first."""

from __future__ import annotations

from test_scheduler import expected_outputs, make_request, make_sim

from engine.scheduler.request import Request


def _with(priority: int, request: Request) -> Request:
    request.priority = priority
    return request


def test_a_late_urgent_request_overtakes_the_waiting_queue() -> None:
    sim = make_sim(max_num_seqs=1)
    busy = make_request("busy", 4, max_tokens=3)
    batch = [_with(5, make_request(f"b{i}", 4, max_tokens=2)) for i in range(10)]
    urgent = _with(0, make_request("urgent", 4, max_tokens=2))
    for request in [busy, *batch, urgent]:
        sim.add(request)
    finished: list[str] = []
    while sim.scheduler.has_work:
        _, update = sim.step()
        finished += [
            r.request_id for r in update.advanced if sim.scheduler.get(r.request_id) is None
        ]
    assert finished[:2] == ["busy", "urgent"]
    assert finished[2:] == [f"b{i}" for i in range(10)]  # FIFO among equals
    assert urgent.output_token_ids == expected_outputs(urgent, 2)


def test_under_pressure_the_lowest_priority_is_preempted_first() -> None:
    sim = make_sim(num_blocks=10, max_num_batched_tokens=64)
    # the oldest request has the lowest priority (largest value): it goes first, not r3
    requests = [
        _with(9 if i == 0 else 1, make_request(f"r{i}", 9, max_tokens=12)) for i in range(4)
    ]
    for request in requests:
        sim.add(request)
    sim.run()
    preempted = [rid for out in sim.outputs for rid in out.preempted]
    assert preempted and preempted[0] == "r0"
    for request in requests:
        assert request.output_token_ids == expected_outputs(request, 12)
    assert sim.blocks.num_free_blocks == sim.blocks.num_total_blocks
