"""LLM(...) takes the KV tier settings as keyword arguments: on the default model, a restart
with a disk tier answers a known conversation from its files, as the offline engine does. A
multi-rank LLM is released by its `with` block, by close() and when it is collected, so that
the process can start the next one."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch.distributed as dist
from tiny_llama import save_tiny_text_model

from engine.llm import LLM
from engine.parallel import RankGroup
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


TINY_GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def _released(ranks: RankGroup | None) -> bool:
    assert ranks is not None
    return not dist.is_initialized() and not any(p.is_alive() for p in ranks.processes)


def test_leaving_a_with_block_releases_a_multi_rank_llm(tmp_path: Path) -> None:
    save_tiny_text_model(tmp_path)
    with LLM(tmp_path, pipeline_parallel_size=2, num_kv_blocks=16) as llm:
        first = llm.generate("hi", TINY_GREEDY)[0].token_ids
        ranks = llm.engine.ranks
    assert _released(ranks)
    with LLM(tmp_path, pipeline_parallel_size=2, num_kv_blocks=16) as llm:
        assert llm.generate("hi", TINY_GREEDY)[0].token_ids == first


def test_a_collected_multi_rank_llm_is_released(tmp_path: Path) -> None:
    save_tiny_text_model(tmp_path)
    llm = LLM(tmp_path, pipeline_parallel_size=2, num_kv_blocks=16)
    ranks = llm.engine.ranks
    with pytest.raises(RuntimeError, match=r"already running .*close it first \(LLM\.close\(\)"):
        LLM(tmp_path, pipeline_parallel_size=2, num_kv_blocks=16)
    del llm
    gc.collect()
    assert _released(ranks)
    LLM(tmp_path, pipeline_parallel_size=2, num_kv_blocks=16).close()
