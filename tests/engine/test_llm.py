"""LLM(...) takes the KV tier settings as keyword arguments: on the default model, a restart
with a disk tier answers a known conversation from its files, as the offline engine does."""

from __future__ import annotations

from pathlib import Path

from engine.llm import LLM
from models.sampling_params import SamplingParams

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


def test_a_restart_answers_a_known_conversation_from_disk(
    default_model_dir: Path, tmp_path: Path
) -> None:
    offline = LLM(default_model_dir, num_kv_blocks=64).chat([QUESTION], GREEDY)[0]
    assert "Paris" in offline.text
    tiers = {
        "kv_offload_cpu_gb": 0.1,
        "kv_offload_disk_path": tmp_path,
        "kv_offload_disk_gb": 0.2,
    }
    first = LLM(default_model_dir, num_kv_blocks=64, **tiers)
    assert first.chat([QUESTION], GREEDY)[0].text == offline.text
    first.close()
    restarted = LLM(default_model_dir, num_kv_blocks=64, **tiers)
    assert restarted.chat([QUESTION], GREEDY)[0].text == offline.text
    stats = restarted.engine.counters.kv_tiers
    assert stats["disk_hits"] == stats["disk_loads"] > 0
    restarted.close()
