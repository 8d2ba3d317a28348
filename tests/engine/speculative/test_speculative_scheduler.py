"""The scheduler's side of speculative decoding, on plain numbers: a request with guesses is
planned as one chunk of k + 1 tokens, verified tokens are appended up to a stop, and the
blocks of rejected guesses are given back."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.kv.block_manager import BlockManager
from engine.scheduler.request import FinishReason, Request, RequestStatus
from engine.scheduler.scheduler import Scheduler
from engine.speculative.guess_lookahead import GuessLookahead
from models.sampling_params import SamplingParams

BS = 4


def _decoding(
    params: SamplingParams, prompt_len: int = 6
) -> tuple[Scheduler, BlockManager, Request]:
    """A scheduler whose one request has its prompt computed and its first token."""
    config = EngineConfig(model_dir=Path("unused"), block_size=BS, max_num_batched_tokens=64)
    blocks = BlockManager(32, BS, enable_prefix_caching=True)
    scheduler = Scheduler(config, blocks, GuessLookahead())
    request = Request("a", list(range(10, 10 + prompt_len)), params, eos_token_ids=frozenset({2}))
    scheduler.add(request)
    scheduler.update(scheduler.schedule(), [50])
    return scheduler, blocks, request


def _speculate(scheduler: Scheduler, request: Request, guesses: list[int], emitted: list[int]):
    request.draft_token_ids = guesses
    out = scheduler.schedule()
    assert out.decodes == () and len(out.prefills) == 1
    chunk = out.prefills[0]
    return out, chunk, scheduler.update(out, [emitted[0]], {request.request_id: emitted[1:]})


def test_guesses_run_as_one_chunk_and_rejected_blocks_go_back() -> None:
    scheduler, blocks, request = _decoding(SamplingParams(max_tokens=50))
    free = blocks.num_free_blocks
    # 7 known tokens (6 + 1), 6 computed: the chunk computes position 6 and 5 guesses
    out, chunk, update = _speculate(scheduler, request, [1, 3, 4, 5, 6], [1, 99])
    assert chunk.start == 6 and chunk.token_ids == (50, 1, 3, 4, 5, 6) and chunk.num_draft == 5
    assert out.num_tokens == 6
    assert request.output_token_ids == [50, 1, 99]
    assert update.more == {"a": (99,)}
    assert request.num_computed_tokens == request.num_known_tokens - 1 == 8
    # the chunk needed positions up to 11 (3 blocks); 9 known tokens need 3 blocks still
    assert len(request.block_ids) == blocks.blocks_for(request.num_known_tokens)
    assert blocks.num_free_blocks == free - (len(request.block_ids) - 2)
    # nothing accepted: back to the blocks of the known tokens
    out, chunk, update = _speculate(scheduler, request, [7, 7, 7, 7, 7, 7, 7], [8])
    assert chunk.num_draft == 7 and request.output_token_ids == [50, 1, 99, 8]
    assert len(request.block_ids) == blocks.blocks_for(10)
    scheduler.audit()


@pytest.mark.parametrize(
    ("params", "emitted", "want", "reason"),
    [
        # the stop id comes second of four: the tokens after it are dropped
        (SamplingParams(max_tokens=50, stop_token_ids=(7,)), [5, 7, 8, 9], [50, 5, 7], "stop"),
        (SamplingParams(max_tokens=50), [5, 2, 8, 9], [50, 5, 2], "stop"),  # EOS
        # max_tokens 3: the first token and two more
        (SamplingParams(max_tokens=3), [5, 6], [50, 5, 6], "length"),
    ],
)
def test_stops_inside_an_accepted_run(
    params: SamplingParams, emitted: list[int], want: list[int], reason: str
) -> None:
    scheduler, blocks, request = _decoding(params)
    _, chunk, update = _speculate(scheduler, request, [5, 6, 7, 8], emitted)
    assert chunk.num_draft <= params.max_tokens - 2  # never guesses past max_tokens
    assert request.output_token_ids == want
    assert request.status is RequestStatus.FINISHED
    assert request.finish_reason == FinishReason(reason)
    assert update.more == {"a": tuple(want[2:])}
    assert blocks.num_free_blocks == blocks.num_total_blocks
    scheduler.audit()


def test_guesses_stop_at_the_context_length() -> None:
    config = EngineConfig(
        model_dir=Path("unused"), block_size=BS, max_num_batched_tokens=64, max_model_len=10
    )
    blocks = BlockManager(32, BS, enable_prefix_caching=False)
    scheduler = Scheduler(config, blocks, GuessLookahead())
    request = Request("a", list(range(10, 16)), SamplingParams(max_tokens=50), max_model_len=10)
    scheduler.add(request)
    scheduler.update(scheduler.schedule(), [50])
    _, chunk, _ = _speculate(scheduler, request, [5, 6, 7, 8, 9], [5, 6, 7])
    assert chunk.num_draft == 2  # 7 known tokens: two guesses and one more make 10
    assert request.output_token_ids == [50, 5, 6, 7]
    assert request.finish_reason is FinishReason.LENGTH
    assert blocks.num_free_blocks == blocks.num_total_blocks


def test_guesses_never_preempt() -> None:
    """A guess that needs a block when none is free is dropped: the request decodes plainly."""
    config = EngineConfig(model_dir=Path("unused"), block_size=BS, max_num_batched_tokens=64)
    blocks = BlockManager(4, BS, enable_prefix_caching=False)
    scheduler = Scheduler(config, blocks, GuessLookahead())
    a = Request("a", list(range(10, 16)), SamplingParams(max_tokens=50))
    b = Request("b", list(range(20, 27)), SamplingParams(max_tokens=50))
    scheduler.add(a)
    scheduler.add(b)
    scheduler.update(scheduler.schedule(), [50, 51])
    assert blocks.num_free_blocks == 0
    a.draft_token_ids = [1, 2, 3, 4]
    out = scheduler.schedule()
    assert out.prefills == () and set(out.decodes) == {a, b}
    assert out.preempted == ()


def test_a_preempted_request_drops_its_guesses() -> None:
    """Guesses belong to the step they were proposed for: a request preempted in it comes
    back without them (a later step may be planned without a proposal, overlapped)."""
    config = EngineConfig(model_dir=Path("unused"), block_size=BS, max_num_batched_tokens=64)
    blocks = BlockManager(4, BS, enable_prefix_caching=False)
    scheduler = Scheduler(config, blocks, GuessLookahead())
    a = Request("a", list(range(10, 18)), SamplingParams(max_tokens=50))  # 2 blocks
    b = Request("b", list(range(20, 27)), SamplingParams(max_tokens=50))  # 2 blocks
    scheduler.add(a)
    scheduler.add(b)
    scheduler.update(scheduler.schedule(), [50, 51])
    assert blocks.num_free_blocks == 0
    b.draft_token_ids = [1, 2, 3]
    out = scheduler.schedule()  # a's next position needs a third block: b goes
    assert out.preempted == ("b",)
    assert b.status is RequestStatus.WAITING and b.draft_token_ids == []
