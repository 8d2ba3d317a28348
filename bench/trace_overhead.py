"""What tracing costs serving: `splitserve bench serve` against two clusters of the same run,
one tracing every request (--trace-sample-ratio 1, exporting to an OTLP/HTTP receiver in this
process), one with tracing off, the rounds interleaved (on, off, on, off, ...).

    python -m bench.trace_overhead --rounds 5 --num-requests 8 --rate 0.25 \\
        --max-prompt 128 --max-output 32

Both clusters run for the whole benchmark (1 prefill + 1 decode each, TCP transfer), so the
one that waits sits idle while the other serves. Reported per mode: TTFT and TPOT p50 over
every round's requests and tracing's difference (ms, and % of TPOT); the CPU time the router
and the two nodes used per request (steadier than latencies on a loaded machine); each
round's p50s (their spread within one mode is the noise the difference is read against);
the spans the receiver took; the load average before and after. Latencies on a shared
machine move with its load, which interleaving spreads evenly over both modes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, write_json
from bench.policy_sweep import Up
from bench.serve import DEFAULT_SLO, SMOLLM2_VOCAB, ServeConfig, run_sweep
from bench.serve_client import LoadOptions
from bench.serve_stats import summarize

MODES = ("on", "off")
SERVING = ("router", "prefill-0", "decode-0")  # the processes whose CPU time counts


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time the processes `pids` have used so far (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / tick


class SpanSink:
    """An OTLP/HTTP traces receiver that counts the spans it is sent (and keeps nothing)."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        self.spans = 0
        lock, sink = threading.Lock(), self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                req = ExportTraceServiceRequest()
                req.ParseFromString(self.rfile.read(int(self.headers.get("content-length", 0))))
                n = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
                with lock:
                    sink.spans += n
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _up(mode: str, args: argparse.Namespace, sink: SpanSink, run_dir: Path) -> Up:
    flags = ["--transfer", "tcp"]
    if mode == "on":
        flags += ["--otlp-traces-endpoint", sink.url, "--trace-sample-ratio", "1.0"]
    cluster = argparse.Namespace(prefill=1, decode=1, threads_per_node=args.threads_per_node,
                                 up_args=flags)  # fmt: skip
    return Up("kv_aware", cluster, run_dir / mode)


def _config(args: argparse.Namespace, url: str, mode: str) -> ServeConfig:
    return ServeConfig(
        url=url, model=None, workload=args.workload, rates=(args.rate,),
        num_requests=args.num_requests, duration_s=None, max_prompt=args.max_prompt,
        max_output=args.max_output, vocab_size=SMOLLM2_VOCAB, seed=args.seed, slo=DEFAULT_SLO,
        load=LoadOptions(args.timeout, progress=False), warmup=1, label=f"tracing {mode}",
    )  # fmt: skip


def compare(
    records: dict[str, list[dict[str, Any]]], durations: dict[str, float]
) -> dict[str, Any]:
    """Per mode the pooled summary; tracing's difference in TTFT and TPOT p50."""
    out: dict[str, Any] = {
        mode: summarize(records[mode], durations[mode], None, DEFAULT_SLO) for mode in MODES
    }
    on, off = out["on"], out["off"]
    ttft = on["ttft_ms"]["p50"] - off["ttft_ms"]["p50"]
    tpot = on["tpot_ms"]["p50"] - off["tpot_ms"]["p50"]
    out["ttft_p50_added_ms"] = round(ttft, 3)
    out["tpot_p50_added_ms"] = round(tpot, 3)
    out["tpot_p50_added_pct"] = round(100 * tpot / off["tpot_ms"]["p50"], 2)
    return out


def _line(report: dict[str, Any], spans: int) -> str:
    on, off = report["on"], report["off"]
    load = report["load_average_before_after"]
    return (
        f"TTFT p50 on {on['ttft_ms']['p50']:.1f} off {off['ttft_ms']['p50']:.1f} ms "
        f"({report['ttft_p50_added_ms']:+.2f}); TPOT p50 on {on['tpot_ms']['p50']:.2f} "
        f"off {off['tpot_ms']['p50']:.2f} ms ({report['tpot_p50_added_pct']:+.2f}%); "
        f"CPU per request on {on['cpu_ms_per_request']:.1f} off {off['cpu_ms_per_request']:.1f}"
        f" ms; {spans} spans; load {load[0][0]:.1f} -> {load[1][0]:.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.trace_overhead", description=__doc__, allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    a = parser.add_argument
    a("--rounds", type=int, default=3, help="runs per mode, the modes interleaved")
    a("--workload", default="chat")
    a("--rate", type=float, default=0.5, help="requests per second")
    a("--num-requests", type=int, default=16, help="requests per round")
    a("--max-prompt", type=int, default=256)
    a("--max-output", type=int, default=32)
    a("--threads-per-node", type=int, default=1)
    a("--seed", type=int, default=0)
    a("--timeout", type=float, default=300.0)
    a("--out", type=Path, default=RESULTS_DIR / "trace_overhead.json")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    load_before = os.getloadavg()
    records: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    durations = dict.fromkeys(MODES, 0.0)
    rounds: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}  # each round's p50s
    cpu = dict.fromkeys(MODES, 0.0)  # CPU seconds the serving processes used in the rounds
    sink = SpanSink()
    with tempfile.TemporaryDirectory(prefix="trace-overhead-") as tmp:
        ups = {m: _up(m, args, sink, Path(tmp)) for m in MODES}
        try:
            for round_no in range(args.rounds):
                for mode in MODES:
                    print(f"== round {round_no + 1} tracing {mode}", flush=True)
                    pids = [int(ups[mode].layout["pids"][name]) for name in SERVING]
                    used = cpu_seconds(pids)
                    result = asyncio.run(run_sweep(_config(args, ups[mode].url, mode), None))
                    cpu[mode] += cpu_seconds(pids) - used
                    point = result["points"][0]
                    records[mode] += point["records"]
                    durations[mode] += point["duration_s"]
                    summary = point["summary"]
                    rounds[mode].append({k: summary[f"{k}_ms"]["p50"] for k in ("ttft", "tpot")})
        finally:
            for up in ups.values():
                up.stop()
    sink.close()
    report = compare(records, durations)
    for mode in MODES:  # the warm-up request of each round ran too
        report[mode]["cpu_ms_per_request"] = round(
            1e3 * cpu[mode] / (len(records[mode]) + args.rounds), 2
        )
    report.update(spans_received=sink.spans, load_average_before_after=[load_before,
                  os.getloadavg()], cpus=os.cpu_count(), round_p50_ms=rounds)  # fmt: skip
    print(_line(report, sink.spans))
    config = {k: v for k, v in vars(args).items() if k != "out"}
    out = write_json(args.out, {"bench": "trace_overhead", "config": config, **report,
                                "records": records})  # fmt: skip
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
