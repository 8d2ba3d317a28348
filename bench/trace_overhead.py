"""What tracing costs serving: `splitserve bench serve` against two clusters of one
configuration, one tracing every request (--trace-sample-ratio 1, exporting to an OTLP/HTTP
receiver in this process), one with tracing off, in alternating rounds (on off, off on, on
off, ...), after one untimed warm-up round each.

    python -m bench.trace_overhead --rounds 6 --num-requests 16 --rate 0.5 \\
        --max-prompt 128 --max-output 32

Both clusters run for the whole benchmark (1 prefill + 1 decode each, TCP transfer), so the
one that waits sits idle while the other serves. Reported: each round's TTFT and TPOT p50
per mode; tracing's added TTFT (ms) and TPOT (%) as the median over rounds of that round's
on - off, with the noise of those differences (their median absolute deviation); CPU time
per request and per output token of the router and each node (from /proc, steadier than
latencies on a busy machine); and the verdict on the bound (TTFT p50 +5 ms, TPOT p50 +3%):
holds, exceeded, or inconclusive where the noise exceeds the bound. A loaded machine is
named in the output: its figures are not to be quoted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
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
from bench.trace_overhead_report import MODES, compare, cpu_table, lines, verdict

__all__ = ["SpanSink", "compare", "cpu_seconds", "main"]
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


def _config(args: argparse.Namespace, url: str, mode: str, warm: bool = False) -> ServeConfig:
    return ServeConfig(
        url=url, model=None, workload=args.workload, rates=(args.rate,),
        num_requests=2 if warm else args.num_requests, duration_s=None,
        max_prompt=args.max_prompt, max_output=args.max_output, vocab_size=SMOLLM2_VOCAB,
        seed=args.seed, slo=DEFAULT_SLO, load=LoadOptions(args.timeout, progress=False),
        warmup=0, label=f"tracing {mode}{' warm-up' if warm else ''}",
    )  # fmt: skip


class Rounds:
    """The records, each round's p50s and each process's CPU seconds, per mode."""

    def __init__(self) -> None:
        self.records: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
        self.durations = dict.fromkeys(MODES, 0.0)
        self.p50s: list[dict[str, dict[str, float]]] = []
        self.cpu: dict[str, dict[str, float]] = {m: dict.fromkeys(SERVING, 0.0) for m in MODES}

    def run(self, args: argparse.Namespace, ups: dict[str, Up], round_no: int) -> None:
        """One round: both modes, in the order that alternates from round to round."""
        order = MODES if round_no % 2 == 0 else MODES[::-1]
        p50s: dict[str, dict[str, float]] = {}
        for mode in order:
            print(f"== round {round_no + 1} tracing {mode}", flush=True)
            pids = {name: int(ups[mode].layout["pids"][name]) for name in SERVING}
            used = {name: cpu_seconds([pid]) for name, pid in pids.items()}
            point = asyncio.run(run_sweep(_config(args, ups[mode].url, mode), None))["points"][0]
            for name, pid in pids.items():
                self.cpu[mode][name] += cpu_seconds([pid]) - used[name]
            self.records[mode] += point["records"]
            self.durations[mode] += point["duration_s"]
            summary = point["summary"]
            p50s[mode] = {k: summary[f"{k}_ms"]["p50"] for k in ("ttft", "tpot")}
        self.p50s.append(p50s)

    def report(self) -> dict[str, Any]:
        out = compare(self.records, self.durations)
        out["round_p50_ms"] = self.p50s
        out["median_round_p50_ms"] = {
            m: {k: statistics.median(r[m][k] for r in self.p50s) for k in ("ttft", "tpot")}
            for m in MODES
        }
        out["verdict"] = verdict(self.p50s)
        out["cpu"] = cpu_table(self.cpu, self.records)
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.trace_overhead", description=__doc__, allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    a = parser.add_argument
    a("--rounds", type=int, default=6, help="rounds of both modes, the order alternating")
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
    rounds, sink = Rounds(), SpanSink()
    with tempfile.TemporaryDirectory(prefix="trace-overhead-") as tmp:
        ups = {m: _up(m, args, sink, Path(tmp)) for m in MODES}
        try:
            for mode in MODES:  # connections, caches and allocations, untimed
                asyncio.run(run_sweep(_config(args, ups[mode].url, mode, warm=True), None))
            for round_no in range(args.rounds):
                rounds.run(args, ups, round_no)
        finally:
            for up in ups.values():
                up.stop()
    sink.close()
    report = rounds.report()
    report.update(spans_received=sink.spans, load_average_before_after=[load_before,
                  os.getloadavg()], cpus=os.cpu_count())  # fmt: skip
    print("\n".join(lines(report)))
    config = {k: v for k, v in vars(args).items() if k != "out"}
    out = write_json(args.out, {"bench": "trace_overhead", "config": config, **report,
                                "records": rounds.records})  # fmt: skip
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
