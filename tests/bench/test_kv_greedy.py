"""bench.kv_greedy: where a run's greedy tokens part from the reference's (the tiny random
Llama with float32 and int8 KV), and its unseen prompts are read by no test."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tiny_llama import save_tiny_llama
from tiny_tokenizer import save_byte_tokenizer

from bench.kv_greedy import UNSEEN, Parting, greedy, partings
from engine.outputs import GenerationOutput, TokenLogprob


def _output(tokens: list[int], top: list[tuple[float, float]] | None) -> GenerationOutput:
    logprobs = None
    if top is not None:
        logprobs = [
            TokenLogprob(t, a, ((t, a), (t + 1, b))) for t, (a, b) in zip(tokens, top, strict=True)
        ]
    return GenerationOutput([1], tokens, "", None, logprobs)


def test_partings_name_the_first_differing_token_and_the_reference_gap() -> None:
    ref = _output([5, 6, 7], [(-0.1, -3.0), (-0.6, -0.7), (-0.2, -2.0)])
    same, other = _output([5, 6, 7], None), _output([5, 9, 7], None)
    assert partings([ref, ref], [same, other]) == [Parting(1, 1, pytest.approx(0.1))]
    with pytest.raises(ValueError, match="prompt 0: the reference has no top-2 logprobs"):
        partings([_output([5, 6], None)], [_output([5, 8], None)])


def test_greedy_runs_give_every_token_and_part_where_they_differ(tmp_path: Path) -> None:
    save_tiny_llama(tmp_path)
    save_byte_tokenizer(tmp_path)
    rng = random.Random(0)
    prompts = [[1] + [rng.randrange(3, 128) for _ in range(30)] for _ in range(8)]
    fp32, int8 = greedy(tmp_path, prompts, "auto", 32), greedy(tmp_path, prompts, "int8", 32)
    assert [len(o.token_ids) for o in fp32 + int8] == [32] * 16  # EOS ignored
    assert partings(fp32, fp32) == []
    for p in partings(fp32, int8):  # measured: one, at a gap of 0.0003 nats
        a, b = fp32[p.prompt].token_ids, int8[p.prompt].token_ids
        assert a[: p.token] == b[: p.token] and a[p.token] != b[p.token] and p.gap >= 0


def test_no_test_reads_the_unseen_prompts() -> None:
    tests = Path(__file__).resolve().parents[1]
    for path in tests.rglob("*.py"):
        text = path.read_text()
        assert not [p for p in UNSEEN if p in text], path
