"""A headless Chromium driven over the DevTools protocol (websockets): open a page, read it
with JavaScript in real time (conditions waited for with deadlines), take a screenshot.

The binary is Debian's `chromium` (or SPLITSERVE_CHROMIUM); `find_browser` is None without
one, and the caller skips saying so."""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
START_TIMEOUT_S = 60.0


def find_browser() -> str | None:
    given = os.environ.get("SPLITSERVE_CHROMIUM")
    return given or next(filter(None, map(shutil.which, BROWSERS)), None)


class Page:
    """One tab: `evaluate` runs an expression and returns its JSON value."""

    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        self._ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:  # events come in between: skip them
            answer = json.loads(self._ws.recv(timeout=30))
            if answer.get("id") == call_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                result: dict[str, Any] = answer["result"]
                return result

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float, what: str) -> Any:
        """The expression's value once it is truthy; AssertionError naming `what` after
        `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not (value := self.evaluate(expression)):
            assert time.monotonic() < deadline, f"not within {timeout_s:.0f}s: {what}"
            time.sleep(0.25)
        return value

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))


class Browser:
    """`with Browser(binary, profile_dir) as b: page = b.open(url)`."""

    def __init__(self, binary: str, profile: Path) -> None:
        profile.mkdir(parents=True, exist_ok=True)
        (profile / "DevToolsActivePort").unlink(missing_ok=True)  # a previous run's port
        argv = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
        argv += ["--window-size=1280,1100", "--remote-debugging-port=0"]
        argv += [f"--user-data-dir={profile}", "about:blank"]
        self._log = open(profile / "browser.log", "wb")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)
        self.port = self._port(profile / "DevToolsActivePort")
        self._sockets: list[ClientConnection] = []

    def _port(self, path: Path) -> int:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            with contextlib.suppress(OSError, ValueError, IndexError):
                return int(path.read_text().splitlines()[0])
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the browser did not start (exit code {self.proc.poll()})")
            time.sleep(0.1)

    def open(self, url: str) -> Page:
        resp = httpx.put(f"http://127.0.0.1:{self.port}/json/new?{url}", timeout=30)
        resp.raise_for_status()
        ws = connect(resp.json()["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        self._sockets.append(ws)
        return Page(ws)

    def close(self) -> None:
        for ws in self._sockets:
            with contextlib.suppress(Exception):
                ws.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self._log.close()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
