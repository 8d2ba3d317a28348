"""Each setting is declared once. Its flags and SPLITSERVE_* variable appear in product code
only in the module that declares it (config_kit generates every command line, environment,
`up` flag and chart key from the declaration); its name in quotes only in its component's
package too (its own messages and logs name it). Elsewhere code reads it as an attribute.
The exceptions are the declaration's own: a setting whose `up` mode is OWN is set by the
launcher for each process it starts, one whose `helm` mode is CHART by the chart's templates.

Product code: the packages' modules (docstrings aside: they may name flags for a reader) and
the chart's templates (comments aside); the generated chart files are the declarations'.
A one-word name (host, port, model) is too common a word to look for in quotes; its flag and
variable are still looked for.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from import_rules import ALLOWED

from config_kit import Declared, Helm, Up, declared
from node.settings import NodeSettings
from planner.settings import PlannerSettings
from router.settings import RouterSettings

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "helm" / "splitserve" / "templates"
COMPONENTS = (NodeSettings, RouterSettings, PlannerSettings)  # their parts and bases included


def settings() -> dict[tuple[type, str], Declared]:
    """Every declared setting, once, by (the class declaring it, field)."""
    out = {}
    for cls in COMPONENTS:
        for d in declared(cls):
            out[(declaring_class(d), d.field)] = d
    return out


def declaring_class(d: Declared) -> type:
    return next(c for c in d.owner.__mro__ if d.field in inspect.get_annotations(c))


def spellings(d: Declared) -> set[str]:
    """How code would hand `d` on by hand: its flags, its variable, its quoted name."""
    names = [d.name, *d.setting.aliases, *d.setting.deprecated]
    out = {"--" + n.replace("_", "-") for n in names} | {d.env}
    return out | {d.name} if "_" in d.name else out


def python_strings(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of each string constant of a module, docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    for node in ast.walk(tree):
        is_text = isinstance(node, ast.Constant) and isinstance(node.value, str)
        if is_text and id(node) not in docstrings:
            yield node.lineno, node.value


def template_words(path: Path) -> Iterator[tuple[int, str]]:
    """(line, word) of a template, its {{/* comments */}} and # comment lines left out."""
    text = re.sub(
        r"\{\{-?\s*/\*.*?\*/\s*-?\}\}",
        lambda m: "\n" * m[0].count("\n"),
        path.read_text(),
        flags=re.S,
    )
    for number, line in enumerate(text.splitlines(), 1):
        if not line.lstrip().startswith("#"):
            for word in re.findall(r"[-\w]+", line):
                yield number, word


def product_files() -> Iterator[tuple[Path, Iterator[tuple[int, str]]]]:
    for package in sorted(set(ALLOWED) - {"config_kit"}):
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path, python_strings(path)
    for path in sorted(TEMPLATES.iterdir()):
        yield path, template_words(path)


def allowed(d: Declared, path: Path, text: str) -> bool:
    """Where `d` may be spelled: its declaring module; its name in quotes in its component's
    package too (its own messages and logs name it); the launcher if it sets `d` itself, the
    chart's templates if they do."""
    dotted = declaring_class(d).__module__.split(".")
    if path == ROOT.joinpath(*dotted).with_suffix(".py"):
        return True
    if text == d.name and path.is_relative_to(ROOT / dotted[0]):
        return True
    if d.setting.up is Up.OWN and path.parent == ROOT / "launcher":
        return True
    return d.setting.helm is Helm.CHART and path.parent == TEMPLATES


def test_every_setting_is_spelled_only_where_it_is_declared() -> None:
    by_spelling: dict[str, list[Declared]] = {}
    for d in settings().values():
        for text in spellings(d):
            by_spelling.setdefault(text, []).append(d)
    found = []
    for path, strings in product_files():
        for line, text in strings:
            text = text.strip()
            declaring = by_spelling.get(text, [])
            if declaring and not any(allowed(d, path, text) for d in declaring):
                found.append(f"{path.relative_to(ROOT)}:{line}: {text!r} ({declaring[0].label})")
    assert found == []


def test_the_check_finds_a_setting_handed_on_by_hand(tmp_path: Path) -> None:
    """The pattern this test exists for: a command line that spells a node setting."""
    module = tmp_path / "up_plan.py"
    module.write_text(
        '"""Mentions --max-num-seqs in a docstring."""\nargv = ["--max-num-seqs", "8"]\n'
    )
    max_num_seqs = next(d for d in settings().values() if d.name == "max_num_seqs")
    hits = [text for _, text in python_strings(module) if text in spellings(max_num_seqs)]
    assert hits == ["--max-num-seqs"]
    assert not allowed(max_num_seqs, module, "--max-num-seqs")


@pytest.mark.parametrize("cls", COMPONENTS, ids=lambda c: c.__name__)
def test_a_name_is_one_setting_in_a_component(cls: type) -> None:
    names = [d.name for d in declared(cls)]
    assert len(names) == len(set(names))
