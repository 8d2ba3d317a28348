"""Constrained decoding in the engine: from random weights, every output under a JSON schema
parses and validates, on both samplers, with and without overlapped scheduling; the prefill
role constrains the first token; a matcher rebuilt from the tokens so far continues where the
first left off; a bad grammar is refused."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema
import llguidance
import numpy as np
import pytest
import torch
from tiny_llama import save_tiny_llama
from tiny_tokenizer import VOCAB, save_byte_tokenizer
from tokenizers import Tokenizer

from bench.grammar_schemas import SCHEMAS
from engine.config import EngineConfig, Role
from engine.engine import LLMEngine
from engine.sampling.grammar import GrammarMasks, Grammars, apply_grammar_mask, unpack_bitmask
from models.sampling_params import SamplingParams

PROMPTS = [[(5 * i + 3 * j) % 200 + 3 for j in range(5 + i)] for i in range(4)]
CHOSEN = [SCHEMAS[i] for i in (4, 7, 13, 16)]  # nested objects, arrays, bounds, optional fields
MODEL_VOCAB = 320  # larger than the tokenizer's: the padded ids must never be drawn


def _grammar(schema: dict) -> str:
    options = {"whitespace_flexible": False}
    return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=options)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("grammar")
    save_tiny_llama(path, vocab_size=MODEL_VOCAB)
    save_byte_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))


def _run(engine: LLMEngine, params: list[SamplingParams]) -> dict[str, tuple[list[int], str]]:
    for i, p in enumerate(params):
        engine.add_request(f"r{i}", PROMPTS[i % len(PROMPTS)], p)
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(params))}
    reasons: dict[str, str] = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
            if out.finished:
                reasons[out.request_id] = str(out.finish_reason)
    assert engine.stats().free_blocks == engine.stats().total_blocks
    assert len(engine.grammars) == 0
    return {k: (v, reasons[k]) for k, v in tokens.items()}


def _engine(tiny_dir: Path, **kw: object) -> LLMEngine:
    return LLMEngine(EngineConfig(model_dir=tiny_dir, block_size=4, num_kv_blocks=128, **kw))  # type: ignore[arg-type]


@pytest.mark.parametrize(("overlap", "temperature"), [(True, 1.0), (False, 0.0), (False, 1.0)])
def test_random_weights_under_a_schema_give_valid_json(
    tiny_dir: Path, tokenizer: Tokenizer, overlap: bool, temperature: float
) -> None:
    engine = _engine(tiny_dir, async_scheduling=overlap)
    params = [
        SamplingParams(max_tokens=200, temperature=temperature, seed=i, grammar=_grammar(s))
        for i, (s, _) in enumerate(CHOSEN)
    ]
    params.append(SamplingParams(max_tokens=8, temperature=temperature, seed=9))  # free row
    results = _run(engine, params)
    for i, (schema, _) in enumerate(CHOSEN):
        ids, reason = results[f"r{i}"]
        assert reason == "stop" and ids[-1] == 2  # the grammar ended it with EOS
        assert max(ids) < VOCAB
        value = json.loads(tokenizer.decode(ids))
        jsonschema.validate(value, schema)
    assert engine.counters.constrained_requests == len(CHOSEN)
    assert engine.counters.grammar_mask_steps > 0


def test_constrained_rows_are_not_speculated_and_stay_valid(
    tiny_dir: Path, tokenizer: Tokenizer
) -> None:
    engine = _engine(tiny_dir, speculative_method="ngram", num_speculative_tokens=4)
    params = [
        SamplingParams(max_tokens=200, temperature=0.0, grammar=_grammar(s)) for s, _ in CHOSEN
    ]
    params.append(SamplingParams(max_tokens=60, temperature=0.0))  # free row: may speculate
    results = _run(engine, params)
    for i, (schema, _) in enumerate(CHOSEN):
        ids, reason = results[f"r{i}"]
        assert reason == "stop" and ids[-1] == 2
        jsonschema.validate(json.loads(tokenizer.decode(ids)), schema)


def test_the_same_weights_without_a_grammar_do_not_write_json(
    tiny_dir: Path, tokenizer: Tokenizer
) -> None:
    params = [SamplingParams(max_tokens=30, temperature=1.0, seed=i) for i in range(4)]
    for ids, _ in _run(_engine(tiny_dir), params).values():
        with pytest.raises(ValueError):
            json.loads(tokenizer.decode(ids))


def test_the_prefill_role_constrains_the_first_token(tiny_dir: Path, tokenizer: Tokenizer) -> None:
    schema = {"type": "array", "items": {"type": "integer"}}
    engine = _engine(tiny_dir, role=Role.PREFILL)
    for i in range(4):
        engine.add_request(
            f"r{i}", PROMPTS[i], SamplingParams(temperature=1.0, seed=i, grammar=_grammar(schema))
        )
    firsts = {}
    while engine.has_unfinished() and len(firsts) < 4:
        for out in engine.step():
            firsts[out.request_id] = out.new_token_ids[0]
    assert {tokenizer.decode([t]) for t in firsts.values()} == {"["}
    for i in range(4):
        engine.release(f"r{i}")
    assert len(engine.grammars) == 0


def test_a_matcher_rebuilt_from_the_tokens_so_far_gives_the_same_masks(
    tiny_dir: Path, tokenizer: Tokenizer
) -> None:
    schema, doc = CHOSEN[0]
    ids = tokenizer.encode(json.dumps(doc, separators=(",", ":"))).ids
    grammars = Grammars(tiny_dir, MODEL_VOCAB, [2])
    grammars.add("a", _grammar(schema))
    for t in ids[:10]:
        grammars.consume(["a"], [t])
    grammars.add("b", _grammar(schema), ids[:10])  # as a resumed request would
    masks = grammars.start(["a", "b"], torch.device("cpu")).result()
    assert masks is not None
    assert masks.every_row and torch.equal(masks.refused[0], masks.refused[1])
    assert not masks.refused[0, ids[10]] and (~masks.refused[0]).sum() < VOCAB
    with pytest.raises(ValueError, match="do not match"):
        grammars.add("c", _grammar(schema), tokenizer.encode("nope").ids)
    grammars.close()


def test_a_bad_grammar_is_refused(tiny_dir: Path) -> None:
    engine = _engine(tiny_dir)
    bad = llguidance.LLMatcher.grammar_from_json_schema({"type": "foo"})
    with pytest.raises(ValueError, match="grammar"):
        engine.add_request("r", [3, 4], SamplingParams(grammar=bad))
    assert not engine.has_unfinished() and len(engine.grammars) == 0


def test_the_mask_sets_minus_inf_outside_the_allowed_tokens() -> None:
    bitmask = np.zeros((1, 2), dtype=np.int32)
    bitmask[0, 0] = 0b1010  # tokens 1 and 3
    allowed = unpack_bitmask(bitmask, 70, torch.device("cpu"))  # beyond 64 bits: refused
    assert allowed.shape == (1, 70) and allowed[0].nonzero().flatten().tolist() == [1, 3]
    logits = torch.zeros(2, 70)
    masked = apply_grammar_mask(logits, GrammarMasks(torch.tensor([1]), ~allowed))
    assert torch.isinf(masked[1]).sum() == 68 and not torch.isinf(masked[0]).any()
    both = apply_grammar_mask(
        logits, GrammarMasks(torch.tensor([0, 1]), ~allowed.repeat(2, 1), True)
    )
    assert torch.equal(torch.isinf(both).sum(dim=1), torch.tensor([68, 68]))
    assert not torch.isinf(logits).any()  # the input is not modified


def test_a_request_resumed_from_its_tokens_so_far_finishes_its_json(
    tiny_dir: Path, tokenizer: Tokenizer
) -> None:
    schema, _ = CHOSEN[1]
    params = SamplingParams(max_tokens=200, temperature=1.0, seed=5, grammar=_grammar(schema))
    ((ids, _),) = _run(_engine(tiny_dir), [params]).values()
    so_far = ids[:6]  # as a decode node that died after 6 tokens would have streamed them
    engine = _engine(tiny_dir)  # another node: prompt + tokens so far, the grammar fed them
    rest = dataclasses.replace(params, max_tokens=200 - len(so_far), seed=6)
    engine.add_request("r", PROMPTS[0] + so_far, rest, grammar_tokens=so_far)
    tail: list[int] = []
    while engine.has_unfinished():
        for out in engine.step():
            tail += out.new_token_ids
    assert tail[-1] == 2
    jsonschema.validate(json.loads(tokenizer.decode(so_far + tail)), schema)
    assert len(engine.grammars) == 0
