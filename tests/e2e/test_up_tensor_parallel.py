"""Prefill and decode pools of different tensor- and pipeline-parallel sizes through
`splitserve up`: the openai client's answers equal the offline TP=1 engine's (the oracle
every TP=1 cluster test matches), the decode node reads one copy of each prompt's KV (each
layer and head once), a dead rank (tensor-parallel or pipeline stage) takes its node down
with code 4, and Ctrl-C leaves no process, rank workers included. A tiny random Qwen2 model
(3 layers, 4 heads, 2 KV heads) with the default model's tokenizer."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from cluster_harness import Cluster, alive, running_cluster
from oracle import Expected, Oracle
from prometheus_client.parser import text_string_to_metric_families
from session_procs import rank_workers, session_processes

from kv_transfer import PeerInfo, nixl_available
from tests.engine.model.tiny_families import save_family

pytestmark = pytest.mark.e2e

PROMPTS = [  # longer than the router's local-prefill limit: each goes through the prefill pool
    "The history of Paris spans more than two thousand years. It began as a small settlement "
    "on an island in the Seine and grew into the capital of France.",
    "List three prime numbers greater than one hundred, then explain why each of them is "
    "prime, step by step, as a teacher would explain it to a curious student.",
]
MAX_TOKENS = 12
BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def tiny_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-qwen2-tp")
    vocab = json.loads((default_model_dir / "config.json").read_text())["vocab_size"]
    save_family("qwen2", path, vocab_size=vocab, num_hidden_layers=3)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (default_model_dir / name).is_file():
            shutil.copy(default_model_dir / name, path / name)
    return path


def one_copy_bytes(model_dir: Path, prompt_tokens: list[int]) -> int:
    """Bytes of the prompts' KV blocks, every KV head once (fp32)."""
    config = json.loads((model_dir / "config.json").read_text())
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    block = config["num_hidden_layers"] * 2 * BLOCK_SIZE * config["num_key_value_heads"]
    blocks = sum(-(-n // BLOCK_SIZE) for n in prompt_tokens)
    return blocks * block * head_dim * 4


NIXL = pytest.mark.skipif(not nixl_available(), reason="needs NIXL")


@pytest.mark.parametrize(
    ("tp", "transfer"),
    [
        (["--prefill-tp", "2"], "tcp"),
        (["--decode-tp", "2"], "tcp"),
        pytest.param(["--prefill-tp", "2"], "nixl", marks=NIXL),  # rank 1's own NIXL agent
    ],
    ids=["2x1", "1x2", "2x1-nixl"],
)
def test_mixed_tensor_parallel_pools_answer_like_tp1(
    tiny_dir: Path, tmp_path: Path, tp: list[str], transfer: str
) -> None:
    want = Oracle(tiny_dir).complete(PROMPTS, MAX_TOKENS)
    args = ["--prefill", "1", "--decode", "1", *tp, "--num-kv-blocks", "64"]
    args += ["--transfer", transfer]
    with running_cluster(tiny_dir, tmp_path / "run", *args, check_clean_exit=True) as up:
        answer_like(up, want, tiny_dir)
        wide = up.node_names("prefill" if "--prefill-tp" in tp else "decode")[0]
        assert len(rank_workers(up.pids[wide])) == 1  # rank 1 runs under the node
        if transfer == "nixl":  # rank 1's cells came from its own agent
            peer = PeerInfo.from_json(up.stats(wide).info.peer_info)
            assert [s.nixl_metadata is not None for s in peer.shards] == [False, True]
    assert session_processes(up.proc.pid) == []


def test_a_pipeline_parallel_prefill_pool_answers_like_one_rank_until_a_stage_dies(
    tiny_dir: Path, tmp_path: Path
) -> None:
    """`--prefill-pp 2 --decode-pp 1`: the decode node reads each layer from the stage that
    holds it (one copy of the KV); then SIGKILL the prefill node's stage 1: the node exits
    with code 4 and Ctrl-C leaves no process."""
    want = Oracle(tiny_dir).complete(PROMPTS, MAX_TOKENS)
    args = ["--prefill", "1", "--decode", "1", "--prefill-pp", "2", "--decode-pp", "1"]
    with running_cluster(tiny_dir, tmp_path / "run", *args, "--num-kv-blocks", "64",
                         "--transfer", "tcp") as up:  # fmt: skip
        answer_like(up, want, tiny_dir)
        victim = up.pids["prefill-0"]
        workers = rank_workers(victim)
        assert len(workers) == 1  # stage 1 runs under the node
        os.kill(workers[0], signal.SIGKILL)
        wait_until(lambda: not alive(victim), "prefill-0 exits")
        wait_until(lambda: "prefill-0 exited with code 4" in up.output(), "the launcher sees it")
    assert session_processes(up.proc.pid) == []


def answer_like(up: Cluster, want: list[Expected], tiny_dir: Path) -> None:
    """The openai client's answers to PROMPTS equal the oracle's `want`; the decode node
    moved one copy of each prompt's KV and every node ends idle with its blocks free."""
    client = up.openai_client()
    model = client.models.list().data[0].id
    prompt_tokens = []
    for prompt, expected in zip(PROMPTS, want, strict=True):
        got = client.completions.create(
            model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
        )
        assert got.choices[0].text == expected.text
        assert got.usage is not None
        assert got.usage.completion_tokens == expected.completion_tokens
        prompt_tokens.append(got.usage.prompt_tokens)
    counters = up.stats(up.node_names("decode")[0]).counters
    assert counters["transfer_ok"] == len(PROMPTS)
    assert counters["transfer_bytes"] == one_copy_bytes(tiny_dir, prompt_tokens)
    assert_idle(up)


def assert_idle(up: Cluster) -> None:
    names = list(up.layout["nodes"])
    for name, stats in up.wait_idle(names).items():
        assert stats.load.free_blocks == stats.load.total_blocks, name


class Stream(threading.Thread):
    """One streamed completion, read to the end on its own thread."""

    def __init__(self, up: Cluster, model: str, prompt: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.client, self.model = up.openai_client(), model
        self.prompt, self.max_tokens = prompt, max_tokens
        self.chunks: list[str] = []
        self.finish: str | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            stream = self.client.completions.create(
                model=self.model, prompt=self.prompt, max_tokens=self.max_tokens,
                temperature=0, stream=True,
            )  # fmt: skip
            for chunk in stream:
                for choice in chunk.choices:
                    self.chunks.append(choice.text)
                    self.finish = choice.finish_reason or self.finish
        except BaseException as exc:
            self.error = exc


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.02)


def test_a_killed_rank_takes_its_node_down_and_its_streams_resume(
    tiny_dir: Path, tmp_path: Path
) -> None:
    """SIGKILL rank 1 of a decode node (TP=2) mid-stream: the node exits with code 4, the
    router resumes its streams on the other decode node, every stream ends with the offline
    engine's text, and Ctrl-C then leaves no process."""
    prompts = [f"{PROMPTS[i % 2]} Part {i}:" for i in range(4)]
    max_tokens = 150
    want = Oracle(tiny_dir).complete(prompts, max_tokens)
    args = ["--prefill", "1", "--decode", "2", "--decode-tp", "2", "--num-kv-blocks", "96"]
    with running_cluster(tiny_dir, tmp_path / "run", *args, "--transfer", "tcp") as up:
        model = up.openai_client().models.list().data[0].id
        streams = [Stream(up, model, p, max_tokens) for p in prompts]
        for s in streams:
            s.start()
        victim = up.pids["decode-0"]
        wait_until(lambda: up.stats("decode-0").load.running > 0, "a stream on decode-0")
        wait_until(lambda: all(s.chunks for s in streams), "every stream under way")
        workers = rank_workers(victim)
        assert len(workers) == 1
        os.kill(workers[0], signal.SIGKILL)
        for s in streams:
            s.join(120)
            assert not s.is_alive() and s.error is None, s.error
        wait_until(lambda: not alive(victim), "decode-0 exits")
        wait_until(lambda: "decode-0 exited with code 4" in up.output(), "the launcher sees it")
        for s, expected in zip(streams, want, strict=True):
            assert "".join(s.chunks) == expected.text
            assert s.finish == "length"
        metrics = httpx.get(up.base_url + "/metrics", timeout=10, trust_env=False).text
        resumed = [
            s.value
            for family in text_string_to_metric_families(metrics)
            for s in family.samples
            if s.name == "splitserve_router_decode_resumes_total"
        ]
        assert sum(resumed) >= 1  # decode-0's streams went on on decode-1
    assert session_processes(up.proc.pid) == []
