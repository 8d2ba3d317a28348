"""The serving benchmark against a fake OpenAI-compatible streaming server (no cluster)."""

from __future__ import annotations

import asyncio
import copy
import json
import multiprocessing
import socket
import time
from collections.abc import AsyncIterator, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from bench import serve
from bench.serve_client import Clock, stream_one
from bench.serve_stats import SLO, summarize
from bench.workloads import RequestSpec, get_workload, poisson_arrivals
from launcher.cli import main as splitserve

HANG = 7  # a prompt starting with this token id never gets an answer
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _fails(prompt: list[int]) -> bool:
    return len(prompt) % 5 == 0


def fake_openai_app(bodies: list[dict[str, Any]]) -> FastAPI:
    """Streams `max_tokens` one-token chunks. Prefill takes 0.1 ms per prompt token, the gap
    between tokens 1 to 3 ms by prompt; prompts of a length divisible by 5 get a 503, a
    model other than fake-model a 404."""
    app = FastAPI()

    @app.get("/received")
    async def received() -> list[dict[str, Any]]:
        return bodies

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()
        bodies.append(body)
        prompt, n = body["prompt"], body["max_tokens"]
        if body["model"] != "fake-model":
            error = {"message": "no such model", "type": "x", "param": "model", "code": None}
            return JSONResponse({"error": error}, status_code=404)
        if _fails(prompt):
            error = {"message": "overloaded", "type": "x", "param": None, "code": None}
            return JSONResponse({"error": error}, status_code=503)
        gap = 1e-3 * (1 + prompt[-1] % 3)

        async def events() -> AsyncIterator[str]:
            await asyncio.sleep(3600 if prompt[0] == HANG else 1e-4 * len(prompt))
            for i in range(n):
                await asyncio.sleep(gap if i else 0)
                yield "data: " + json.dumps({"choices": [{"index": 0, "text": f" t{i}"}]}) + "\n\n"
            usage = {"prompt_tokens": len(prompt), "completion_tokens": n}
            yield "data: " + json.dumps({"choices": [], "usage": usage}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def _serve_fake(port_out: Connection) -> None:
    """Child process: run the fake server on a free port and send the port back."""
    bodies: list[dict[str, Any]] = []
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port_out.send(sock.getsockname()[1])
    config = uvicorn.Config(fake_openai_app(bodies), log_level="warning", lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


@pytest.fixture(scope="module")
def fake_server() -> Iterator[str]:
    """Base URL of the fake server, in a process of its own so that the client's token
    timestamps are not skewed by sharing the GIL with it."""
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_serve_fake, args=(send,), daemon=True)
    proc.start()
    try:
        assert receive.poll(30), "fake server did not start"
        url = f"http://127.0.0.1:{receive.recv()}"
        for _ in range(300):
            try:
                httpx.get(f"{url}/v1/models", timeout=1.0)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.join(10)


def _received(url: str) -> list[dict[str, Any]]:
    return list(httpx.get(f"{url}/received").json())


def _bench(url: str, out: Path, *extra: str) -> dict[str, Any]:
    argv = ["--url", url, "--workload", "mix", "--max-prompt", "64", "--max-output", "8"]
    argv += ["--num-requests", "12", "--out", str(out), "--no-progress", "--warmup", "0", *extra]
    assert serve.main(argv) == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def result(fake_server: str, tmp_path_factory: Any) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("serve") / "a.json"
    return _bench(fake_server, out, "--rates", "50,inf", "--label", "fast")


def test_one_record_per_request_with_monotonic_timestamps(result: dict[str, Any]) -> None:
    assert [p["rate"] for p in result["points"]] == [50.0, None]
    for point in result["points"]:
        records = point["records"]
        assert sorted(r["id"] for r in records) == list(range(12))
        ok = [r for r in records if r["error"] is None]
        assert ok and len(ok) < len(records)  # the fake server fails some on purpose
        for r in ok:
            times = [r["start"], r["first_token_time"], *r["token_times"], r["end"]]
            assert times == sorted(times), r
            assert r["start"] >= r["scheduled"] - 1e-3
            assert r["output_tokens"] == r["max_tokens"] == len(r["token_times"])
        assert point["duration_s"] >= max(r["end"] for r in records)


def test_latencies_follow_their_definitions(result: dict[str, Any]) -> None:
    for r in (r for p in result["points"] for r in p["records"] if r["error"] is None):
        first, last = r["first_token_time"], r["token_times"][-1]
        assert r["ttft"] == pytest.approx(first - r["start"])
        assert r["tpot"] == pytest.approx((last - first) / (r["output_tokens"] - 1))  # DistServe
        assert r["itl"] == pytest.approx(np.diff(r["token_times"]).tolist())
        assert r["e2e"] == pytest.approx(r["end"] - r["start"])
    tpots = [r["tpot"] for p in result["points"] for r in p["records"] if r["tpot"] is not None]
    assert np.median(tpots) > 0.9e-3  # the fake server waits 1 to 3 ms between tokens


def test_failed_requests_counted_but_kept_out_of_latency(result: dict[str, Any]) -> None:
    point = result["points"][0]
    failed = [r for r in point["records"] if r["error"] is not None]
    assert all(_fails([0] * r["prompt_tokens"]) and "503" in r["error"] for r in failed)
    assert all(r["ttft"] is None and r["tpot"] is None and r["itl"] == [] for r in failed)
    s = point["summary"]
    assert (s["failed"], s["completed"]) == (len(failed), 12 - len(failed))
    ttfts = [r["ttft"] * 1e3 for r in point["records"] if r["error"] is None]
    assert s["ttft_ms"]["p50"] == pytest.approx(np.percentile(ttfts, 50))
    assert s["request_throughput"] == pytest.approx(s["completed"] / point["duration_s"])


def test_requests_carry_exact_token_prompts(fake_server: str, result: Any) -> None:
    bodies = _received(fake_server)
    specs = get_workload("mix").capped(64, 8).sample(12, seed=0, vocab_size=49152)
    sent = {tuple(b["prompt"]): b for b in bodies}
    for spec in specs:
        body = sent[tuple(spec.prompt_ids)]
        assert body["max_tokens"] == spec.max_tokens and body["model"] == "fake-model"
        assert body["stream"] and body["ignore_eos"] and body["temperature"] == 0.0


def _record(ttft: float | None, tpot: float | None, error: str | None = None) -> dict[str, Any]:
    return {"ttft": ttft, "tpot": tpot, "itl": [], "e2e": ttft, "error": error,
            "prompt_tokens": 4, "output_tokens": 3}  # fmt: skip


def test_goodput_counts_only_requests_meeting_both_slos() -> None:
    records = [
        _record(0.05, 0.200),  # TPOT too slow
        _record(0.50, 0.010),  # TTFT too slow
        _record(0.05, 0.010),  # good
        _record(0.05, None),  # one output token: judged on TTFT alone, good
        _record(None, None, error="HTTP 503: overloaded"),
    ]
    s = summarize(records, duration_s=2.0, rate=1.0, slo=SLO(ttft_ms=100, tpot_ms=50))
    assert s["goodput"] == pytest.approx(2 / 2.0)
    assert s["slo_attainment"] == pytest.approx(2 / 5)
    assert (s["completed"], s["failed"]) == (4, 1)


def test_seeded_workloads_and_arrivals_are_reproducible() -> None:
    mix = get_workload("mix")
    a, b = mix.sample(50, seed=3, vocab_size=1000), mix.sample(50, seed=3, vocab_size=1000)
    assert a == b and a != mix.sample(50, seed=4, vocab_size=1000)
    assert {s.kind for s in a} == {"chat", "summarize"}
    for s in a:
        lengths = (32, 256, 128, 256) if s.kind == "chat" else (512, 1536, 16, 64)
        assert lengths[0] <= len(s.prompt_ids) <= lengths[1]
        assert lengths[2] <= s.max_tokens <= lengths[3]
        assert all(100 <= t < 1000 for t in s.prompt_ids)
    capped = get_workload("summarize").capped(max_prompt=300, max_output=10).sample(20, 0, 1000)
    assert max(len(s.prompt_ids) for s in capped) <= 300 and max(s.max_tokens for s in capped) <= 10
    times = poisson_arrivals(4000, rate=8.0, seed=1)
    assert times == poisson_arrivals(4000, rate=8.0, seed=1) and times == sorted(times)
    assert np.mean(np.diff(times)) == pytest.approx(1 / 8.0, rel=0.1)


def _slowed(result: dict[str, Any], factor: float) -> dict[str, Any]:
    """The same run with every duration `factor` times longer."""
    slow = copy.deepcopy(result)
    slow["config"]["label"] = "slow"
    for point in slow["points"]:
        point["duration_s"] *= factor
        for r in point["records"]:
            for key in ("scheduled", "start", "first_token_time", "end", "ttft", "tpot", "e2e"):
                r[key] = None if r[key] is None else r[key] * factor
            r["token_times"] = [t * factor for t in r["token_times"]]
            r["itl"] = [t * factor for t in r["itl"]]
    return slow


def test_compare_prints_ratios_and_plots_png(
    result: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(result))
    b.write_text(json.dumps(_slowed(result, 2.0)))
    plots = tmp_path / "plots"
    argv = ["--compare", str(a), str(b), "--plot-dir", str(plots), "--slo-ttft-ms", "1000"]
    assert serve.main(argv) == 0
    out = capsys.readouterr().out
    assert "A = fast, B = slow" in out and "B/A" in out
    ttft_p50 = next(line for line in out.splitlines() if line.startswith("TTFT p50"))
    assert ttft_p50.split()[-1] == "2.00x"
    req_s = next(line for line in out.splitlines() if line.startswith("req/s"))
    assert req_s.split()[-1] == "0.50x"
    pngs = sorted(p.name for p in plots.iterdir())
    assert pngs == ["fast_latency_cdf.png", "goodput_vs_rate.png", "slow_latency_cdf.png"]
    import matplotlib.pyplot as plt

    for png in plots.iterdir():
        assert png.read_bytes().startswith(PNG_MAGIC)
        assert plt.imread(png).shape[0] > 100


async def test_a_stalled_request_times_out(fake_server: str) -> None:
    from bench.serve_client import Target

    target = Target(fake_server, "fake-model")
    spec = RequestSpec(0, "chat", [HANG, 200, 300], max_tokens=4)
    async with httpx.AsyncClient() as client:
        record = await stream_one(client, target, spec, Clock(), 0.0, timeout_s=0.3)
    assert record.error == "timeout after 0.3 s" and not record.ok
    assert 0.3 <= record.end - record.start < 2.0


def test_a_rate_schedule_is_summarized_by_phase_not_as_rate_inf(
    fake_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _bench(fake_server, tmp_path / "s.json", "--rate-schedule", "20:0.5,40:0.5")
    out = capsys.readouterr().out
    table = out[out.index("ok/all") :].splitlines()[1:]  # the summary after the phases
    assert [line.split()[0] for line in table[:3]] == ["20:0.5", "40:0.5", "all"], out
    assert "inf" not in "".join(table)
    assert [p["rate"] for p in data["points"][0]["phases"]] == [20, 40]


def test_unreachable_url_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    assert splitserve(["bench", "serve", "--url", url, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: cannot reach {url}") and "\n" not in err


def test_splitserve_bench_serve_runs_through_the_cli(
    fake_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli.json"
    argv = ["bench", "serve", "--url", fake_server + "/v1/", "--rate", "inf"]
    argv += ["--num-requests", "3", "--max-output", "4", "--out", str(out), "--no-progress"]
    assert splitserve(argv) == 0
    assert "best goodput" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["config"]["model"] == "fake-model" and len(data["points"][0]["records"]) == 3


def test_a_sweep_is_not_started_when_every_warmup_request_fails(
    fake_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--url", fake_server, "--model", "nope", "--warmup", "2", "--no-progress"]
    assert serve.main(argv) == 2
    err = capsys.readouterr().err
    assert "every warmup request failed" in err and "HTTP 404: no such model" in err
