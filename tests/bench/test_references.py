"""A reference engine that cannot run is reported with its error, not a traceback of ours."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.references import run_vllm


def test_a_python_without_vllm_is_named(tmp_path: Path) -> None:
    failed = r"(?s)vllm run failed \(exit 1\).*No module named 'vllm'"
    with pytest.raises(RuntimeError, match=failed):
        run_vllm(sys.executable, tmp_path, [[1, 2, 3]], 4, "float32")
