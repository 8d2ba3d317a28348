"""A streaming client in a process of its own, timing as the bench client does: TTFT (first
chunk with text) and TPOT ((last - first chunk with text) / (tokens - 1), the tokens from
the usage chunk), in ms. Run apart
from the test so that the test process (its OTLP receiver, its garbage collector) never
delays a timestamp.

    python timed_client.py BASE_URL PROMPT MAX_TOKENS ID...   (one JSON line per id)
"""

from __future__ import annotations

import json
import sys
import time

import httpx


def timed(client: httpx.Client, url: str, body: dict[str, object], rid: str) -> dict[str, object]:
    marks: list[float] = []
    tokens = 0
    start = time.perf_counter()
    with client.stream("POST", url, json=body, headers={"x-request-id": rid}) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            now, event = time.perf_counter(), json.loads(line[6:])
            if any(c.get("text") for c in event["choices"]):
                marks.append(now)
            if event.get("usage"):
                tokens = int(event["usage"]["completion_tokens"])
    tpot = (marks[-1] - marks[0]) / (tokens - 1) * 1e3 if tokens > 1 else None
    return {"id": rid, "ttft_ms": (marks[0] - start) * 1e3, "tpot_ms": tpot, "tokens": tokens}


def main(argv: list[str]) -> None:
    base, prompt, max_tokens, ids = argv[0], argv[1], int(argv[2]), argv[3:]
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.Client(timeout=120, trust_env=False) as client:
        client.get(base + "/health")  # connected, as a benchmark client is
        for rid in ids:
            print(json.dumps(timed(client, base + "/v1/completions", body, rid)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
