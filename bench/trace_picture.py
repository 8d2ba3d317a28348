"""A picture of one real trace: `splitserve up` (1 prefill + 1 decode) exporting every span
over OTLP/HTTP to a receiver in this process, a few streamed requests, and the last one's
trace drawn as an SVG waterfall (bench.trace_svg) into docs/tracing_trace.svg.

    python -m bench.trace_picture --transfer tcp --requests 3 --max-tokens 16

The first requests warm the cluster (connections, caches); the picture is of the last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import httpx

from bench.otlp_receiver import OtlpReceiver, ReceivedSpan, trace_of
from bench.trace_svg import render
from bench.up_child import UpChild

DOCS_SVG = Path(__file__).resolve().parent.parent / "docs" / "tracing_trace.svg"
PROMPT = (
    "The history of the lighthouse begins with fires lit on hills near harbours, long before "
    "towers of stone rose over the rocks, and sailors learned to read the coast by night from"
)
WANTED = {"splitserve.request", "router.stream", "prefill.compute", "decode.generate"}


def stream(url: str, request_id: str, max_tokens: int) -> None:
    """One streamed completion under `request_id`, read to its end."""
    body = {"model": "smollm2", "prompt": PROMPT, "max_tokens": max_tokens, "stream": True,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    headers = {"x-request-id": request_id}
    with (
        httpx.Client(timeout=300, trust_env=False) as client,
        client.stream("POST", url + "/v1/completions", json=body, headers=headers) as r,
    ):
        if r.status_code != 200:
            raise RuntimeError(f"request {request_id} answered {r.status_code}: {r.read()!r}")
        for _ in r.iter_lines():
            pass


def complete(request_id: str) -> Callable[[list[ReceivedSpan]], bool]:
    """A receiver condition: `request_id`'s trace holds the spans the picture must show."""

    def found(spans: list[ReceivedSpan]) -> bool:
        return {s.name for s in trace_of(spans, request_id)} >= WANTED

    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.trace_picture", description=__doc__, allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    a = parser.add_argument
    a("--transfer", choices=("tcp", "nixl"), default="tcp")
    a("--requests", type=int, default=3, help="streamed requests; the last is drawn")
    a("--max-tokens", type=int, default=16)
    a("--out", type=Path, default=DOCS_SVG)
    args = parser.parse_args(argv)
    if args.requests < 1:
        parser.error(f"--requests must be >= 1, got {args.requests}")
    os.environ.setdefault("OTEL_BSP_SCHEDULE_DELAY", "200")  # ms between export batches
    receiver = OtlpReceiver()
    flags = ["--prefill", "1", "--decode", "1", "--transfer", args.transfer,
             "--otlp-traces-endpoint", receiver.url]  # fmt: skip
    try:
        with tempfile.TemporaryDirectory(prefix="trace-picture-") as tmp:
            up = UpChild(flags, Path(tmp))
            try:
                ids = [f"trace-picture-{i}" for i in range(args.requests)]
                for rid in ids:
                    stream(up.url, rid, args.max_tokens)
                spans = receiver.wait_for(complete(ids[-1]))
            finally:
                up.stop()
    finally:
        receiver.close()
    trace = trace_of(spans, ids[-1])
    title = (
        f"one request's trace: 1 prefill + 1 decode, {args.transfer.upper()} KV transfer, "
        f"{args.max_tokens} tokens streamed (ms since the router received it)"
    )
    args.out.write_text(render(trace, title))
    print(json.dumps({"out": str(args.out), "spans": len(trace)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
