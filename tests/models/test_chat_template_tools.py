"""A chat template that reads `tools` renders the tool definitions; one that does not is
reported as such (the router then puts the tools in a system message)."""

from __future__ import annotations

import jinja2.meta
import jinja2.nodes
import pytest

from models.chat_template import ChatTemplate

NATIVE = (
    "{% if tools %}{% for t in tools %}[tool {{ t.function.name }}]{% endfor %}{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
)
PLAIN = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}


def test_a_template_that_reads_tools_renders_them() -> None:
    template = ChatTemplate(NATIVE)
    assert template.uses_tools
    text = template.render([{"role": "user", "content": "hi"}], False, {}, tools=[TOOL])
    assert text == "[tool get_weather]<user>hi"
    assert template.render([{"role": "user", "content": "hi"}], False, {}) == "<user>hi"


def test_the_template_is_parsed_for_tools_once(monkeypatch: pytest.MonkeyPatch) -> None:
    template, found = ChatTemplate(NATIVE), []
    scan = jinja2.meta.find_undeclared_variables

    def counted(ast: jinja2.nodes.Template) -> set[str]:
        found.append(ast)
        return scan(ast)

    monkeypatch.setattr(jinja2.meta, "find_undeclared_variables", counted)
    assert template.uses_tools and template.uses_tools
    assert not ChatTemplate(PLAIN).uses_tools and not ChatTemplate(PLAIN).uses_tools
    assert len(found) == 3  # NATIVE once, each PLAIN template once


def test_a_template_without_tools_says_so() -> None:
    assert not ChatTemplate(PLAIN).uses_tools
