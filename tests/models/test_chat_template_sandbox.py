"""The template sandbox: the helpers transformers gives templates behave the same here, and
what a template cannot do with its input is a ValueError (a 400), never another exception."""

from __future__ import annotations

import pytest

from models.chat_template import ChatTemplate

USER = [{"role": "user", "content": "hi"}]


def _render(text: str, **variables: object) -> str:
    return ChatTemplate(text).render(USER, False, {"eos_token": "</s>"}, variables=variables)


def test_dict_namespace_and_tojson_keywords() -> None:
    text = (
        "{% set ns = namespace(n=1) %}{% set ns.n = ns.n + 1 %}{{ ns.n }} "
        "{{ dict(b=2, a=1) | tojson(sort_keys=True, separators=(',', ':')) }} "
        "{{ dict.fromkeys(['x']) | tojson }} {{ {'k': 'é'} | tojson(indent=1) }}"
    )
    assert _render(text) == '2 {"a":1,"b":2} {"x": null} {\n "k": "é"\n}'


@pytest.mark.parametrize(
    "text",
    [
        "{% set ns = namespace(_secret=1) %}",
        "{% set ns = namespace() %}{% set ns._secret = 1 %}",
        "{% set x = messages.append(1) %}",  # an immutable sandbox
        "{{ ''.__class__.__mro__ }}",
    ],
)
def test_reaching_into_internals_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="chat template rejected the messages"):
        _render(text)


def test_internals_read_as_nothing() -> None:
    assert _render("[{{ messages.__class__ }}]") == "[]"


@pytest.mark.parametrize(
    ("text", "variables"),
    [
        ("{{ messages[0].content + 1 }}", {}),  # TypeError
        ("{{ messages[5].content.upper() }}", {}),  # undefined
        ("{{ raise_exception('roles must alternate') }}", {}),
        ("{{ boom + 1 }}", {"boom": "text"}),
    ],
)
def test_what_a_template_cannot_render_is_a_value_error(
    text: str, variables: dict[str, object]
) -> None:
    with pytest.raises(ValueError, match="chat template rejected the messages"):
        _render(text, **variables)


def test_variables_override_special_tokens_but_not_the_servers_names() -> None:
    assert _render("{{ eos_token }}") == "</s>"
    assert _render("{{ eos_token }}", eos_token="<end>") == "<end>"
    with pytest.raises(ValueError, match="'add_generation_prompt' is set by the server"):
        _render("x", add_generation_prompt=True)
