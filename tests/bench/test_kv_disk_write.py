"""bench.kv_disk_write on a tiny shape: the tier writes every block of a prefill's burst,
drops none, and reports its rate against plain writes of the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

from bench.kv_disk_write import main


def test_a_burst_is_written_whole_and_rated_against_plain_writes(tmp_path: Path) -> None:
    out = tmp_path / "kv_disk_write.json"
    argv = ["--shape", "tiny", "--layers", "1", "--blocks", "16", "--repeats", "1"]
    argv += ["--prompt-tokens", "256", "--dir", str(tmp_path), "--out", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    burst = result["burst"]
    assert burst["disk_stores"] == burst["blocks"] == 16 and burst["disk_dropped"] == 0
    assert result["tier_to_raw"] > 0 and result["raw_gbps"] > 0
