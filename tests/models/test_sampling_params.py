"""SamplingParams rejects every invalid value with a ValueError naming the field."""

from __future__ import annotations

import pytest

from models.sampling_params import SamplingParams


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("max_tokens", 0),
        ("max_tokens", 2.5),
        ("top_k", -1),
        ("top_k", 1.5),
        ("min_p", 2.0),
        ("min_p", -0.1),
        ("presence_penalty", 2.5),
        ("presence_penalty", -2.5),
        ("frequency_penalty", 3.0),
        ("frequency_penalty", -2.1),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", -1.0),
        ("stop_token_ids", (5, -1)),
        ("seed", 1.5),
        ("logprobs", 30),
        ("logprobs", -1),
    ],
)
def test_bad_value_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


def test_defaults_and_boundaries_are_valid() -> None:
    default = SamplingParams()
    assert not default.greedy
    assert not default.has_penalties
    edge = SamplingParams(
        temperature=0.0,
        top_p=1.0,
        min_p=1.0,
        presence_penalty=-2.0,
        frequency_penalty=2.0,
        logprobs=20,
        max_tokens=1,
        stop_token_ids=[0, 7],  # type: ignore[arg-type]
    )
    assert edge.greedy
    assert edge.has_penalties
    assert edge.stop_token_ids == (0, 7)


def test_params_are_frozen() -> None:
    params = SamplingParams()
    with pytest.raises(AttributeError):
        params.temperature = 0.5  # type: ignore[misc]
