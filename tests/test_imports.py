"""The package rules of DESIGN.md hold in the source (layering, engine's rooms, no circles),
and the checker catches a break, naming the import."""

from __future__ import annotations

import textwrap
from pathlib import Path

from import_rules import violations

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
    assert any(v.startswith("engine/llm.py:1 imports cluster.settings") for v in found), found
    assert any(v.startswith("prefill_node/app.py:2 imports decode_node.runtime") for v in found)
    assert any(v.startswith("kv_transfer/agent.py:1 imports engine") for v in found)
    assert any(v.startswith("models/tokenizer.py:1 imports cluster") for v in found)


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


def test_an_import_circle_is_reported_through_deferred_and_type_only_imports(
    tmp_path: Path,
) -> None:
    root = _tree(
        tmp_path,
        {
            "engine/__init__.py": "",
            "engine/model/__init__.py": "",
            "engine/model/loader.py": """
                def load(quantized):
                    from engine.model.quant.safetensors_loader import load_quantized
            """,
            "engine/model/quant/__init__.py": "",
            "engine/model/quant/safetensors_loader.py": """
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from engine.model.loader import Files
            """,
            "engine/model/decoder.py": "from engine.model.loader import load\n",
        },
    )
    assert violations(root) == [
        "import circle: engine/model/loader.py:3 imports engine.model.quant.safetensors_loader, "
        "engine/model/quant/safetensors_loader.py:4 imports engine.model.loader"
    ]


def test_a_circle_of_three_is_named_by_its_imports(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "kv_transfer/a.py": "from kv_transfer import b\n",
            "kv_transfer/b.py": "import kv_transfer.c\n",
            "kv_transfer/c.py": "def f():\n    from .a import x\n",
        },
    )
    assert violations(root) == [
        "import circle: kv_transfer/a.py:1 imports kv_transfer.b, kv_transfer/b.py:1 imports "
        "kv_transfer.c, kv_transfer/c.py:2 imports kv_transfer.a"
    ]


def test_a_submodule_import_is_not_a_circle_with_its_package(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "engine/__init__.py": "def __getattr__(name):\n    from engine import llm\n",
            "engine/llm.py": "from engine import cpu_kernels\n",
            "engine/cpu_kernels/__init__.py": "from engine.cpu_kernels import build\n",
            "engine/cpu_kernels/build.py": "from engine import cpu_kernels\n",
        },
    )
    assert violations(root) == []


def test_an_upward_room_import_is_reported_whatever_its_kind(tmp_path: Path) -> None:
    """engine's rooms: kv sits below the scheduler, the kernels below the model; rooms of
    one level (cpu_kernels, triton_kernels) never import each other."""
    root = _tree(
        tmp_path,
        {
            "engine/__init__.py": "",
            "engine/kv/__init__.py": "",
            "engine/kv/block_manager.py": "from engine.scheduler.request import Request\n",
            "engine/kv/tiered_blocks.py": """
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from engine.scheduler import request
            """,
            "engine/scheduler/__init__.py": "",
            "engine/scheduler/request.py": "",
            "engine/scheduler/planner.py": "from engine.kv.block_manager import BlockManager\n",
            "engine/triton_kernels/__init__.py": "",
            "engine/triton_kernels/w4a16.py": "def pack():\n    from engine.model import loader\n",
            "engine/cpu_kernels/__init__.py": "from engine.triton_kernels import w4a16\n",
            "engine/model/__init__.py": "",
            "engine/model/quant.py": "from engine import cpu_kernels, triton_kernels\n",
            "engine/model/loader.py": "",
        },
    )
    assert violations(root) == [
        "engine/cpu_kernels/__init__.py:1 imports engine.triton_kernels.w4a16 (engine room "
        "cpu_kernels may not import room triton_kernels: rooms import only the levels below them)",
        "engine/kv/block_manager.py:1 imports engine.scheduler.request (engine room kv may not "
        "import room scheduler: rooms import only the levels below them)",
        "engine/kv/tiered_blocks.py:4 imports engine.scheduler.request (engine room kv may not "
        "import room scheduler: rooms import only the levels below them)",
        "engine/triton_kernels/w4a16.py:2 imports engine.model.loader (engine room "
        "triton_kernels may not import room model: rooms import only the levels below them)",
    ]


def test_a_module_outside_every_room_and_the_facade_from_below_are_reported(
    tmp_path: Path,
) -> None:
    root = _tree(
        tmp_path,
        {
            "engine/__init__.py": "from engine.llm import LLM\n",
            "engine/llm.py": "",
            "engine/kitchen/__init__.py": "",
            "engine/model/__init__.py": "",
            "engine/model/loader.py": "from engine import LLM\n",
        },
    )
    assert violations(root) == [
        "engine.kitchen is in no room of engine (tests/import_rules.py ROOMS)",
        "engine/model/loader.py:1 imports engine (engine room model may not import room "
        "__init__: rooms import only the levels below them)",
    ]
