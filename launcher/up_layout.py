"""The files of `splitserve up` in RUN_DIR: cluster.json (the router URL, the Redis URL, each
node's URL and role, the planner's URL with --planner, every process id, launcher included),
and two header files for curl's `-H @FILE`, readable by this user only:
cluster-token.header (the cluster token, which nodes' /stats need) and, when the router needs
an API key, api-key.header (the first key)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from cluster.auth import CLUSTER_TOKEN_HEADER, ApiKey
from launcher.process import Child
from launcher.redis_server import EmbeddedRedis
from launcher.up_plan import NodePlan

CLUSTER_HEADER = "cluster-token.header"
API_KEY_HEADER = "api-key.header"


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


def write_headers(run_dir: Path, cluster_token: str, key: ApiKey | None) -> None:
    """RUN_DIR's header files (mode 0600); a run without API keys removes a stale key's."""
    write_secret(run_dir / CLUSTER_HEADER, f"{CLUSTER_TOKEN_HEADER}: {cluster_token}\n")
    if key is None:
        (run_dir / API_KEY_HEADER).unlink(missing_ok=True)
    else:
        write_secret(run_dir / API_KEY_HEADER, f"Authorization: Bearer {key.secret.decode()}\n")


def write_secret(path: Path, text: str) -> None:
    """Write `text` to `path`, which only this user may read (made so before anything is
    written, an existing file included)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, 0o600)
        f.write(text)
