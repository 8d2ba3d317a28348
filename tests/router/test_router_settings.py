"""The router's settings: the environment, the served model's name, errors that name the
setting."""

from __future__ import annotations

import pytest

from config_kit import SettingsError, load
from router.settings import RouterSettings


def test_environment_is_read_and_overrides_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPLITSERVE_PORT", "9001")
    monkeypatch.setenv("SPLITSERVE_POLICY", "round_robin")
    settings = load(RouterSettings, port=9002, api_key=None)
    assert settings.port == 9002 and settings.policy == "round_robin"
    assert settings.api_key is None


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"port": 70000}, "port (--port, env SPLITSERVE_PORT)"),
        ({"policy": "random"}, "policy"),
        ({"local_prefill_max_tokens": -1}, "local_prefill_max_tokens"),
        ({"reasoning_parser": "granite"}, "reasoning_parser"),
        ({"response_ttl_s": 0}, "response_ttl_s"),
    ],
)
def test_invalid_values_are_named(values: dict[str, object], named: str) -> None:
    with pytest.raises(SettingsError) as exc:
        load(RouterSettings, **values)
    assert named in str(exc.value)


def test_gpt_oss_reasoning_reads_calls_with_openai_only() -> None:
    assert load(RouterSettings, reasoning_parser="gpt_oss").tool_call_parser == "auto"
    load(RouterSettings, reasoning_parser="gpt_oss", tool_call_parser="openai")
    with pytest.raises(SettingsError, match="tool_call_parser 'openai' reads, not 'hermes'"):
        load(RouterSettings, reasoning_parser="gpt_oss", tool_call_parser="hermes")


def test_served_model_name_defaults_to_the_model_name() -> None:
    assert RouterSettings(model="smollm2").model_name() == "smollm2"
    assert RouterSettings(model="models/my-llama").model_name() == "my-llama"
    assert RouterSettings(model="x", served_model_name="public").model_name() == "public"
