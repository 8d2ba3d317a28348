"""A sending rank's own listener in its own process (used by test_rank_transfer): serves a
KV tensor of ``--shape`` filled from ``--seed`` with ``serve_rank_kv`` for the node identity
and cells given as JSON on the command line, prints {"port": ...}, and serves until its
stdin closes (or it is killed). With "nixl" (a RankAgentSetup) in the setup it serves the
tensor with its own NIXL agent instead (``serve_rank_nixl``) and prints {"nixl_metadata":
base64, "address": int}. With ``stall_after`` n in the setup it answers a READ with the
DATA header and the first n blocks only, prints {"stalled": true} and waits (a rank that
dies or hangs mid-send; the test then kills or stops it)."""

from __future__ import annotations

import argparse
import base64
import json
import socket
import sys
import threading
from typing import Any

import torch

from kv_transfer import tcp_server
from kv_transfer.head_plan import HeadSpan, LayerSpan
from kv_transfer.peer_info import Identity
from kv_transfer.rank_agent import RankAgentSetup, serve_rank_nixl
from kv_transfer.rank_server import RankListener, serve_rank_kv
from kv_transfer.shards import KVShards
from kv_transfer.tcp_protocol import send_data_header


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--setup", required=True)
    args = parser.parse_args()
    setup = json.loads(args.setup)
    gen = torch.Generator().manual_seed(setup["seed"])
    kv = torch.randn(setup["shape"], generator=gen)
    if "nixl" in setup:  # the rank's own NIXL agent instead of a listener
        metadata, address = serve_rank_nixl(kv, setup["rank"], RankAgentSetup(**setup["nixl"]))
        answer = {"nixl_metadata": base64.b64encode(metadata).decode(), "address": address}
        print(json.dumps(answer), flush=True)
        sys.stdin.read()
        return
    listener = RankListener(
        Identity(**setup["identity"]),
        "127.0.0.1",
        "127.0.0.1",
        HeadSpan(*setup["heads"]),
        LayerSpan(*setup["layers"]),
        setup["num_kv_heads"],
    )
    if setup.get("stall_after"):
        stall(int(setup["stall_after"]))
    _, port = serve_rank_kv(kv, setup["rank"], listener)
    print(json.dumps({"port": port}), flush=True)
    sys.stdin.read()  # until the test closes it


def stall(blocks: int) -> None:
    """Serve head READs with the header and ``blocks`` blocks, then stop sending."""

    def serve(conn: socket.socket, body: dict[str, Any], shards: KVShards, first: int) -> None:
        heads, layers = body["heads"], body["layers"]
        views = shards.block_views(0, body["block_ids"], HeadSpan(*heads), LayerSpan(*layers))
        assert views is not None
        send_data_header(conn, sum(v.nbytes for v in views))
        for view in views[:blocks]:
            conn.sendall(view)
        print(json.dumps({"stalled": True}), flush=True)
        threading.Event().wait()

    tcp_server.serve_heads = serve  # type: ignore[assignment]


if __name__ == "__main__":
    main()
