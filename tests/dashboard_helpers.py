"""Shared pieces of the dashboard tests: `istanbul dashboard` as a real subprocess, HTTP calls
to it, and headless Chromium (the system's, driven by Playwright) for the browser tests.

Browser tests (marker `browser`) skip with the reason when Chromium or Playwright is missing,
unless ISTANBUL_REQUIRE_BROWSER=1 (CI), which makes that a failure. Chromium runs headless
with a fresh profile and everything that would reach the network switched off; Playwright
never downloads a browser here (executable_path is the system's).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from .redis_helpers import REPO, istanbul_cmd, istanbul_env

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
REQUIRE_BROWSER = "ISTANBUL_REQUIRE_BROWSER"


class Dashboard:
    """`istanbul dashboard` on a free loopback port, its output in a log file."""

    def __init__(self, tmp: Path, redis_url: str, *args: str, name: str = "dashboard"):
        tmp.mkdir(parents=True, exist_ok=True)
        port_file = tmp / f"{name}.port"
        self.log_path = tmp / f"{name}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            istanbul_cmd("dashboard", "--redis", redis_url, "--port", "0", "--port-file",
                         str(port_file), *args),
            cwd=REPO, env=istanbul_env(), stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError("the dashboard did not start:\n" + self.output())
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{int(port_file.read_text())}"

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def call(self, path: str, method: str = "GET", token: str | None = None,
             timeout: float = 30) -> tuple[int, dict, object]:
        """(status, JSON body, headers) of one request."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(self.url + path, method=method, headers=headers,
                                         data=b"" if method == "POST" else None)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                return reply.status, json.loads(reply.read()), reply.headers
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read()), exc.headers

    def get_text(self, path: str) -> tuple[int, str, dict]:
        with urllib.request.urlopen(self.url + path, timeout=30) as reply:
            return reply.status, reply.read().decode(), dict(reply.headers)

    def stream_events(self, path: str, kinds: set[str], timeout: float = 30) -> dict:
        """Read the server-sent events at `path` until one of each kind in `kinds` came;
        {kind: parsed data of its first event}."""
        found: dict = {}
        with urllib.request.urlopen(self.url + path, timeout=timeout) as reply:
            assert reply.headers["Content-Type"].startswith("text/event-stream")
            kind = None
            deadline = time.monotonic() + timeout
            for raw in reply:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: ") and kind:
                    found.setdefault(kind, json.loads(line[6:]))
                if kinds <= set(found) or time.monotonic() > deadline:
                    break
        return found


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def require_browser() -> str:
    """The Chromium binary, or skip (fail with ISTANBUL_REQUIRE_BROWSER=1) saying what is
    missing."""
    problem = None
    path = chromium_path()
    if path is None:
        problem = ("no Chromium on PATH (Debian: apt-get install chromium chromium-driver; "
                   "scripts/test.sh installs them when it runs as root)")
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            problem = "Playwright is not installed (pip install 'istanbul[test]')"
    if problem:
        if os.environ.get(REQUIRE_BROWSER) == "1":
            pytest.fail(f"{REQUIRE_BROWSER}=1 but {problem}")
        pytest.skip(problem)
    return path


@contextmanager
def chromium(profile: Path, width: int = 1400, height: int = 1300):
    """A headless Chromium context (fresh profile in `profile`); yields it."""
    from playwright.sync_api import sync_playwright
    executable = require_browser()
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=executable, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": width, "height": height})
        try:
            yield context
        finally:
            context.close()


class ConsoleLog:
    """A page's console errors and uncaught exceptions."""

    def __init__(self, page):
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))

    def unexpected(self, allowed: tuple[str, ...] = ()) -> list[str]:
        return [e for e in self.errors if not any(a in e for a in allowed)]
