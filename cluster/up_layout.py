"""RUN_DIR/cluster.json of `splitserve up`: the router URL, the Redis URL, each node's URL
and role, the planner's URL (with --planner) and every process id (launcher included)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from cluster.process import Child
from cluster.redis_server import EmbeddedRedis
from cluster.up_plan import NodePlan


class UpLayout:
    """RUN_DIR/cluster.json: URLs and process ids, rewritten as nodes come and go."""

    def __init__(
        self,
        run_dir: Path,
        args: argparse.Namespace,
        redis_url: str,
        nodes: list[NodePlan],
        children: list[Child],
        redis: EmbeddedRedis | None,
        planner_url: str | None,
    ) -> None:
        self.run_dir, self.args, self.redis_url = run_dir, args, redis_url
        self.nodes, self.children, self.redis = nodes, children, redis
        self.planner_url = planner_url
        self._announced: set[str] = set()

    def write(self) -> None:
        pids = {c.name: c.pid for c in self.children}
        if self.redis is not None and self.redis.pid is not None:
            pids["redis"] = self.redis.pid
        pids["launcher"] = os.getpid()
        layout = {
            "router": f"http://127.0.0.1:{self.args.port}",
            "redis": self.redis_url,
            "nodes": {n.name: {"url": n.url, "role": n.role} for n in self.nodes},
            "pids": pids,
        }
        if self.planner_url is not None:
            layout["planner"] = self.planner_url
        write_json(self.run_dir / "cluster.json", layout)
        for child in self.children:
            if child.name not in self._announced:
                self._announced.add(child.name)
                print(f"started {child.name} pid={child.pid}", flush=True)


def note_pid(run_dir: Path, name: str, pid: int) -> None:
    """Record a restarted process's new pid in cluster.json."""
    path = run_dir / "cluster.json"
    layout = json.loads(path.read_text())
    layout["pids"][name] = pid
    write_json(path, layout)


def write_json(path: Path, data: object) -> None:
    """Replace `path` at once: a reader never sees it half written."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
