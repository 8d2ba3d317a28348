"""The wire protocol: round trips, validation, and the contract with the engine's types."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import TypeAdapter, ValidationError

from cluster.node_records import NodeInfo, NodeLoad, NodeRecord
from cluster.protocol import (
    DecodeRequest,
    KVHandle,
    PrefillRequest,
    PrefillResponse,
    TokenEvent,
    TokenLogprobMsg,
    WireSampling,
)
from engine.outputs import TokenLogprob
from models.sampling_params import SamplingParams


def _handle() -> KVHandle:
    return KVHandle(
        node_id="p0",
        peer_info="eyJhZ2VudCI6ICJwMCJ9",
        block_ids=[4, 9, 2],
        num_tokens=40,
        layout_fingerprint="llama-30x3x64-f32-b16",
        lease_expires_at=1_700_000_000.5,
    )


def test_the_wire_carries_engine_sampling_params() -> None:
    spec = SamplingParams(
        max_tokens=7, temperature=0.5, top_k=3, seed=11, stop_token_ids=(5, 6), logprobs=2
    )
    sent = PrefillRequest(request_id="r", prompt_token_ids=[1], sampling=spec)
    params = PrefillRequest.model_validate_json(sent.model_dump_json()).sampling
    assert isinstance(params, SamplingParams)
    assert params.max_tokens == 7 and params.top_k == 3 and params.stop_token_ids == (5, 6)
    assert params.logprobs == 2 and params.seed == 11


def test_sampling_params_survive_the_wire_round_trip_equal() -> None:
    params = SamplingParams(
        max_tokens=9,
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        min_p=0.05,
        seed=2**62 + 1,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.2,
        stop_token_ids=(3, 7),
        ignore_eos=True,
        logprobs=3,
        logit_bias=((4, -100.0), (9, 2.5)),
        grammar='{"grammars": []}',
    )
    dec = DecodeRequest(request_id="r", prompt_token_ids=[1], sampling=params)
    again = DecodeRequest.model_validate_json(dec.model_dump_json())
    assert again.sampling == params and again == dec
    assert isinstance(again.sampling.stop_token_ids, tuple)
    assert all(isinstance(pair, tuple) for pair in again.sampling.logit_bias)


def test_sampling_on_the_wire_has_one_key_per_engine_field() -> None:
    engine_fields = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
    spec_fields = TypeAdapter(WireSampling).dump_python(SamplingParams(), mode="json")
    assert spec_fields.keys() == engine_fields.keys()
    for name, default in engine_fields.items():
        if default is not dataclasses.MISSING:
            assert spec_fields[name] == default, name


@pytest.mark.parametrize(
    "bad",
    [{"max_tokens": 0}, {"top_p": 0.0}, {"temperature": -1}, {"logprobs": 21}, {"top_k": -1}],
)
def test_wire_sampling_rejects_what_the_engine_rejects(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError) as exc:
        TypeAdapter(WireSampling).validate_python(bad)
    assert next(iter(bad)) in str(exc.value)


@pytest.mark.parametrize(
    "bad",
    [{"top_p": 0.0}, {"logit_bias": [[1, 500]]}, {"grammar": ""}, {"max_tokens": 1.5}],
)
def test_a_refused_sampling_field_is_the_error_location(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError) as exc:
        PrefillRequest.model_validate({"request_id": "r", "prompt_token_ids": [1], "sampling": bad})
    assert [e["loc"] for e in exc.value.errors()] == [("sampling", next(iter(bad)))]


def test_logprob_message_mirrors_engine_token_logprob() -> None:
    engine_lp = TokenLogprob(token_id=5, logprob=-0.25, top=((5, -0.25), (8, -1.5)))
    msg = TokenLogprobMsg(**dataclasses.asdict(engine_lp))
    again = TokenLogprobMsg.model_validate_json(msg.model_dump_json())
    assert again.top == [(5, -0.25), (8, -1.5)]


def test_prefill_and_decode_messages_round_trip_through_json() -> None:
    spec = SamplingParams(max_tokens=4)
    prefill = PrefillRequest(request_id="r1", prompt_token_ids=[1, 2, 3], sampling=spec)
    assert PrefillRequest.model_validate_json(prefill.model_dump_json()) == prefill
    resp = PrefillResponse(
        request_id="r1",
        first_token_id=9,
        finished=False,
        num_prompt_tokens=3,
        num_cached_tokens=0,
        kv=_handle(),
    )
    decoded = PrefillResponse.model_validate_json(resp.model_dump_json())
    assert decoded.kv == _handle()
    dec = DecodeRequest(
        request_id="r1", prompt_token_ids=[1, 2, 3], output_token_ids=[9], sampling=spec, kv=resp.kv
    )
    assert DecodeRequest.model_validate_json(dec.model_dump_json()) == dec


def test_empty_prompt_is_refused() -> None:
    with pytest.raises(ValidationError, match="prompt_token_ids"):
        PrefillRequest(request_id="r", prompt_token_ids=[], sampling=SamplingParams())


def test_token_event_defaults_and_unknown_fields_are_tolerated() -> None:
    event = TokenEvent.model_validate_json('{"token_ids": [1, 2], "future_field": true}')
    assert event.token_ids == [1, 2] and not event.finished and event.error is None


def test_node_record_round_trip() -> None:
    info = NodeInfo(
        node_id="d0",
        role="decode",
        url="http://127.0.0.1:8101",
        model="smollm2",
        layout_fingerprint="fp",
        max_model_len=2048,
        capacity=512,
        started_at=1.0,
    )
    record = NodeRecord(info=info, load=NodeLoad(running=2, kv_usage=0.5), heartbeat_at=2.0)
    assert NodeRecord.model_validate_json(record.model_dump_json()) == record
    with pytest.raises(ValidationError, match="role"):
        NodeInfo.model_validate({**info.model_dump(), "role": "router"})
