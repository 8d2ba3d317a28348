"""The node test harness lives in tests/decode_node (both node suites use it)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "decode_node"))
