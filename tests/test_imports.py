"""The package rules of DESIGN.md hold in the source, and the checker catches a break."""

from __future__ import annotations

import textwrap
from pathlib import Path

from import_rules import edges, violations

ROOT = Path(__file__).resolve().parents[1]


def test_the_project_keeps_its_package_rules() -> None:
    assert violations(ROOT) == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def test_a_forbidden_package_import_is_reported(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "engine/__init__.py": "",
            "engine/llm.py": "from cluster.settings import NodeSettings\n",
            "cluster/__init__.py": "",
            "cluster/settings.py": "",
            "prefill_node/__init__.py": "",
            "prefill_node/app.py": "def f():\n    import decode_node.runtime\n",
            "decode_node/__init__.py": "",
            "decode_node/runtime.py": "",
            "kv_transfer/agent.py": "from engine import llm\n",
            "models/tokenizer.py": "from ..cluster import settings\n",
        },
    )
    found = violations(root)
    assert any(v.startswith("engine.llm:1 imports cluster.settings") for v in found), found
    assert any(v.startswith("prefill_node.app:2 imports decode_node.runtime") for v in found)
    assert any(v.startswith("kv_transfer.agent:1 imports engine") for v in found)
    assert any(v.startswith("models.tokenizer:1 imports cluster") for v in found)


def test_torch_reached_through_an_allowed_package_is_reported(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "router/__init__.py": "",
            "router/app.py": "from models.tokenizer import Tokenizer\n",
            "models/__init__.py": "from models import convert\n",
            "models/tokenizer.py": "",
            "models/convert.py": "import torch\n",
        },
    )
    found = violations(root)
    assert any(v.startswith("importing router loads torch: router.app -> ") for v in found), found


def test_lazy_torch_imports_are_allowed_where_the_rules_say(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "router/app.py": "from models import convert\n",
            "models/__init__.py": "",
            "models/convert.py": """
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    import torch
                def convert():
                    import torch
            """,
        },
    )
    assert violations(root) == []


def test_an_import_circle_is_reported_even_through_a_type_only_import(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "engine/__init__.py": "",
            "engine/config.py": "from engine.kv.sizing import check_fraction\n",
            "engine/kv/__init__.py": "",
            "engine/kv/sizing.py": """
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from engine.config import EngineConfig
            """,
            "engine/kv/cache.py": "from engine.config import parse_dtype\n",
        },
    )
    found = violations(root)
    assert "import circle: engine.config -> engine.kv.sizing" in found, found
    assert not any("engine.kv.cache" in v for v in found), found


def test_a_deferred_import_and_a_submodule_import_are_not_circles(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "engine/__init__.py": "def __getattr__(name):\n    from engine import llm\n",
            "engine/llm.py": "from engine import kernels\n",
            "engine/kernels.py": "def f():\n    from engine import llm\n",
        },
    )
    assert violations(root) == []


def test_the_launcher_imports_each_subcommand_where_the_checker_sees_it() -> None:
    """`splitserve`'s dispatch is plain imports (no importlib by name), so the layering test
    above covers it."""
    dispatch = {e.target for e in edges(ROOT, ["launcher"]) if e.source == "launcher.cli"}
    for command in ("models", "engine", "router", "prefill_node", "decode_node", "planner"):
        assert f"{command}.cli" in dispatch, command
    assert "launcher.up" in dispatch
    assert "importlib" not in {e.target for e in edges(ROOT, ["launcher"])}
