"""The engine tests' shared helpers (tiny models, the tiny tokenizer, the engine driver) live
in this folder; the tests in its rooms import them by name."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
