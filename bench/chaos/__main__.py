"""`python -m bench.chaos --requests 300 --faults all`: every fault against a cluster whose
hosts are network namespaces of this machine (root needed), ending with the table
fault | requests | identical | failed clearly | lost | hung | leaked blocks, written as JSON
too. `--faults rolling-upgrade` (not in `all`) runs every node on release v0.1.0 first, then
rolls each onto this tree under load (bench.chaos.upgrade). Exit code 0 when every fault
meets its targets, 1 when one does not, 2 when this machine cannot make namespaces (or a
worktree of the release)."""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

from bench.chaos.cluster import ClusterConfig
from bench.chaos.faults import FAULTS
from bench.chaos.netns import unavailable_reason
from bench.chaos.report import explain, table
from bench.chaos.run import ARRIVALS, RunConfig, baseline, failed_share_limit, run_fault, session
from bench.chaos.upgrade import UPGRADE, release_tree, run_upgrade
from bench.chaos.upgrade import unavailable_reason as upgrade_unavailable
from bench.chaos.workload import make_specs


def _faults(text: str) -> list[str]:
    names = list(FAULTS) if text == "all" else [n.strip() for n in text.split(",") if n.strip()]
    known = [*FAULTS, UPGRADE.name]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown faults {unknown}; known: {', '.join(known)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chaos", description=__doc__, allow_abbrev=False
    )
    parser.add_argument("--requests", type=int, default=300, help="requests per fault")
    parser.add_argument("--faults", type=_faults, default=list(FAULTS),
                        help=f"all, or some of: {', '.join([*FAULTS, UPGRADE.name])}")  # fmt: skip
    parser.add_argument("--transport", "--transfer", dest="transfer", choices=("tcp", "nixl"),
                        default="nixl",
                        help="KV transport (nixl: UCX over TCP between the hosts)")  # fmt: skip
    parser.add_argument("--concurrency", type=int, default=6, help="requests at a time, at most")
    parser.add_argument("--rate", type=float, default=None,
                        help="requests/s offered under a fault: an open loop, still capped "
                             "by --concurrency (default: the next when one ends)")  # fmt: skip
    parser.add_argument("--arrivals", choices=ARRIVALS, default="poisson",
                        help="with --rate: Poisson arrivals, or fixed gaps of 1/rate")  # fmt: skip
    parser.add_argument("--deadline-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-kv-blocks", type=int, default=256)
    parser.add_argument("--run-dir", type=Path, default=None, help="logs (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=Path("bench/results/chaos.json"))
    args = parser.parse_args(argv)
    reason = unavailable_reason()
    if reason is None and UPGRADE.name in args.faults:
        reason = upgrade_unavailable()
    if reason is not None:
        print(f"bench.chaos: {reason}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from models import ensure_model

    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="splitserve-chaos-"))
    cluster_cfg = ClusterConfig(ensure_model("smollm2"), run_dir, args.transfer, args.num_kv_blocks)
    cfg = RunConfig(
        args.requests, args.concurrency, args.deadline_s, seed=args.seed, rate=args.rate,
        arrivals=args.arrivals,
    )  # fmt: skip
    specs = make_specs(cfg.requests, cfg.seed)
    print(f"logs: {run_dir}", flush=True)
    started = time.monotonic()
    rows = []
    release = release_tree() if UPGRADE.name in args.faults else nullcontext(None)
    with session(cluster_cfg) as cluster, release as old_tree:
        expected = baseline(cluster, specs, cfg)
        for name in args.faults:
            if name == UPGRADE.name and old_tree is not None:
                rows.append(run_upgrade(cluster, specs, expected, cfg, old_tree))
            else:
                rows.append(run_fault(cluster, FAULTS[name], specs, expected, cfg))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    ok = all(r.passes(failed_share_limit(FAULTS.get(r.fault, UPGRADE))) for r in rows)
    print(table(rows))
    if explain(rows):
        print(explain(rows))
    _write(args, rows, cfg, time.monotonic() - started)
    return 0 if ok else 1


def _write(args: argparse.Namespace, rows: list, cfg: RunConfig, took_s: float) -> None:
    from dataclasses import asdict

    from bench.common import environment, write_json

    payload = {
        "benchmark": "chaos",
        "command": "python -m bench.chaos " + " ".join(sys.argv[1:]),
        "transfer": args.transfer,
        "config": asdict(cfg),
        "took_s": round(took_s, 1),
        "environment": environment(),
        "rows": [asdict(r) for r in rows],
    }
    print(f"wrote {write_json(args.json, payload)}")


if __name__ == "__main__":
    sys.exit(main())
