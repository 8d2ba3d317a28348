"""What `splitserve up` prints once its cluster is ready: the URL, the nodes, a request that
works as printed (with an API key's header file when the router needs one), and how to read
a node's /stats (with the cluster token's header file)."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from launcher.up_layout import API_KEY_HEADER, CLUSTER_HEADER
from launcher.up_plan import NodePlan, local_host


def announcement(
    args: argparse.Namespace, model: Path, nodes: list[NodePlan], run_dir: Path, key: str | None
) -> str:
    """`key`: the name of the key in RUN_DIR's api-key.header (None: the router needs none)."""
    base = f"http://{local_host(args.host)}:{args.port}"
    name = args.served_model_name or model.name
    body = {
        "model": name,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 32,
    }
    request = ["curl", f"{base}/v1/chat/completions"]
    if key is not None:
        request += ["-H", f"@{run_dir / API_KEY_HEADER}"]
    request += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    stats = ["curl", "-H", f"@{run_dir / CLUSTER_HEADER}", f"{nodes[0].url}/stats"]
    lines = [
        f"splitserve is up: {base}/v1 (model {name})",
        f"  nodes: {', '.join(f'{n.name} {n.url}' for n in nodes)}",
        f"  try:   {shlex.join(request)}",
        *([f"         (its header file holds the key named {key!r})"] if key else []),
        f"  stats: {shlex.join(stats)}",
        "  Ctrl-C stops everything.",
    ]
    return "\n".join(lines)
