"""The bookkeeping of a hybrid model's state checkpoints, on plain numbers: where a chunk
saves (its sequence's last block boundary, the point its prompt left the cached prefix),
that a save is readable only once its step ran, that a request leaving or a lost step gives
its slots back, least-recently-used reuse that never takes a slot a step is about to read,
and a hit only on the exact prefix."""

from __future__ import annotations

import pytest

from engine.kv.state_checkpoints import (
    MAX_UNPUBLISHED,
    ChunkCheckpoints,
    ChunkSpan,
    StateCheckpoints,
)

SIZE = 4
PROMPT = list(range(100, 119))  # 19 tokens: the last boundary before its last token is 16


def span(rid: str, tokens: list[int], start: int, end: int) -> ChunkSpan:
    return ChunkSpan(rid, tokens, None, start, end)


def saved(book: StateCheckpoints, tokens: list[int], step: object = "s") -> ChunkCheckpoints:
    """``tokens`` prefilled whole in one step that ran."""
    moves = book.plan(step, [span("a", tokens, 0, len(tokens))])[0]
    book.publish(step)
    book.release("a")
    return moves


def test_a_chunk_saves_at_its_last_block_boundary_and_a_repeat_resumes_there() -> None:
    book = StateCheckpoints(4, SIZE)
    assert saved(book, PROMPT) == ChunkCheckpoints(None, ((16, 0),))
    assert book.totals.saves == 1 and book.num_used == 1
    longer = PROMPT + [7, 8, 9]
    hit = book.find(longer, None, 5)
    assert hit is not None and (hit.num_blocks, hit.slot) == (4, 0)
    assert book.find(PROMPT[:15] + [0, *PROMPT[16:]], None, 4) is None  # another block 4
    assert book.find(PROMPT, 12345, 4) is None  # another root (an adapter's chain)
    book.claim("b", hit, 5)
    (moves,) = book.plan("t", [span("b", longer, 16, 22)])
    # it starts from the checkpoint; the matched fifth block's end (20) is where it branches
    assert moves == ChunkCheckpoints(0, ((4, 1),))
    assert book.totals.hits == 1


def test_chunks_save_where_they_pass_the_boundary() -> None:
    book = StateCheckpoints(4, SIZE)
    first = book.plan("s1", [span("a", PROMPT, 0, 10)])[0]
    second = book.plan("s2", [span("a", PROMPT, 10, 16)])[0]  # ends on it: saved after
    third = book.plan("s3", [span("a", PROMPT, 16, 19)])[0]
    assert (first, second, third) == (ChunkCheckpoints(), ChunkCheckpoints(None, ((6, 0),)),
                                      ChunkCheckpoints())  # fmt: skip


def test_a_save_is_read_only_after_its_step_ran() -> None:
    book = StateCheckpoints(4, SIZE)
    book.plan("s", [span("a", PROMPT, 0, 19)])
    assert book.find(PROMPT, None, 4) is None and book.num_pending == 1
    book.publish("other step")  # not this one: nothing changes
    assert book.num_pending == 1
    book.publish("s")
    assert book.find(PROMPT, None, 4) is not None and book.num_pending == 0


@pytest.mark.parametrize("how", ["released", "lost"])
def test_an_unpublished_save_gives_its_slot_back(how: str) -> None:
    book = StateCheckpoints(2, SIZE)
    book.plan("failed", [span("a", PROMPT, 0, 19)])
    other = list(range(200, 219))
    if how == "released":  # the request left (aborted, or every request of a failed step)
        book.release("a")
    book.plan("next", [span("b", other, 0, 19)])  # lost: the next step to run drops it
    book.publish("next")
    assert book.num_used == 1 and book.num_pending == 0
    assert book.find(PROMPT, None, 4) is None and book.find(other, None, 4) is not None


def test_steps_never_published_give_their_slots_back() -> None:
    """Steps run outside the engine's stepper are never published: the oldest ones' saves
    are dropped as more steps are planned, so the slots stay bounded."""
    book = StateCheckpoints(8, SIZE)
    for k in range(MAX_UNPUBLISHED + 3):
        book.plan(f"s{k}", [span(f"r{k}", [k, *PROMPT[1:]], 0, 19)])
    assert book.num_pending == book.num_used == MAX_UNPUBLISHED


def test_the_least_recently_used_checkpoint_makes_room() -> None:
    book = StateCheckpoints(2, SIZE)
    prompts = [[k, *PROMPT[1:]] for k in range(3)]
    saved(book, prompts[0], "s0")
    saved(book, prompts[1], "s1")
    book.claim("x", book.find(prompts[0], None, 4), 4)  # a hit: prompt 0 is used again
    book.plan("s2", [span("x", prompts[0], 16, 19)])
    book.release("x")
    saved(book, prompts[2], "s3")
    assert book.totals.evictions == 1
    assert [book.find(p, None, 4) is not None for p in prompts] == [True, False, True]


def test_a_slot_a_step_reads_is_never_reused_for_a_save() -> None:
    book = StateCheckpoints(1, SIZE)
    saved(book, PROMPT)
    hit = book.find(PROMPT, None, 4)
    book.claim("b", hit, 4)
    # the step that reads it has another chunk first that would save: no room for that one
    moves = book.plan("s", [span("c", list(range(200, 219)), 0, 19), span("b", PROMPT, 16, 19)])
    assert moves == [ChunkCheckpoints(), ChunkCheckpoints(0, ())]
    assert book.totals.evictions == 0


def test_a_prompt_that_leaves_the_cached_prefix_saves_where_it_branches() -> None:
    """The system-prompt case: the first prompt's checkpoint lies past the shared part; the
    second one matches the shared blocks, finds no checkpoint there and saves one at their
    end, where the third resumes."""
    book = StateCheckpoints(4, SIZE)
    system = PROMPT[:12]
    saved(book, system + [1, 2, 3, 4, 5, 6])  # checkpoint at 16
    second = system + [7, 8, 9, 10, 11, 12]
    assert book.find(second, None, 3) is None
    book.claim("b", None, 3)
    (moves,) = book.plan("s", [span("b", second, 0, 18)])
    assert moves == ChunkCheckpoints(None, ((12, 1), (16, 2)))
    book.publish("s")
    hit = book.find(system + [0] * 6, None, 3)
    assert hit is not None and hit.num_blocks == 3


def test_a_capacity_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity >= 1, got 0"):
        StateCheckpoints(0, SIZE)
