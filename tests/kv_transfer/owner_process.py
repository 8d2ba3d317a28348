"""A KV owner in its own process, driven by JSON lines on stdin (used by test_two_processes).

It fills its KV tensor from a seed, publishes its PeerInfo, leases blocks from a free list
like an engine would, and answers with its block counts. Commands:
  {"op": "grant", "request_id": str, "num_blocks": int, "ttl_s": float} -> {"blocks": [...]}
  {"op": "release", "request_id": str} -> {"released": bool}
  {"op": "counts"} -> {"free": int, "leases": int, "held": int, "freed": [request ids]}
"""

from __future__ import annotations

import argparse
import json
import logging
import select
import sys

import torch

from kv_transfer import KVTransferAgent, LeaseTable, TransferConfig

SHAPE = (48, 4, 2, 16, 2, 32)  # [blocks, layers, 2, block_size, kv_heads, head_dim]
FINGERPRINT = "test-fp-4x2x16x2x32-f32"
LAYOUT = "test layout: layers=4 block=16 kv_heads=2 head_dim=32 float32"


def reference_kv(seed: int, device: str = "cpu") -> torch.Tensor:
    """The owner's KV content for `seed`, reproducible in any process."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(SHAPE, generator=gen).to(device)


class Owner:
    def __init__(self, args: argparse.Namespace) -> None:
        self.free = list(range(SHAPE[0]))
        self.freed: list[str] = []
        self.leases = LeaseTable(self._on_free)
        config = TransferConfig(args.node, transport=args.transport, tcp_port=args.port)
        kv = reference_kv(args.seed, args.device)
        self.agent = KVTransferAgent(
            kv, fingerprint=FINGERPRINT, layout=LAYOUT, config=config, leases=self.leases
        )

    def _on_free(self, request_id: str, blocks: list[int]) -> None:
        self.freed.append(request_id)
        self.free.extend(blocks)

    def handle(self, cmd: dict[str, object]) -> dict[str, object]:
        op = cmd["op"]
        if op == "grant":
            n = int(cmd["num_blocks"])  # type: ignore[call-overload]
            blocks, self.free = self.free[-n:], self.free[:-n]
            self.leases.grant(str(cmd["request_id"]), blocks, float(cmd["ttl_s"]))  # type: ignore[arg-type]
            return {"blocks": blocks}
        if op == "release":
            return {"released": self.leases.release(str(cmd["request_id"]))}
        held = self.leases.held()
        return {
            "free": len(self.free),
            "leases": held.leases,
            "held": held.blocks,
            "freed": self.freed,
        }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--transport", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--node", default="owner")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    owner = Owner(args)
    print(json.dumps({"info": owner.agent.info.to_json()}), flush=True)
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], owner.agent.config.poll_interval_s)
        if ready:
            line = sys.stdin.readline()
            if not line:
                return
            print(json.dumps(owner.handle(json.loads(line))), flush=True)
        owner.agent.poll()


if __name__ == "__main__":
    main()
