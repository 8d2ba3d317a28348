"""The node test harness and its fixtures live in tests/decode_node (both node suites use
them)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "decode_node"))

from node_harness import model_dir, redis_url

__all__ = ["model_dir", "redis_url"]
