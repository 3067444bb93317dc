"""`istanbul serve` on a port it cannot have: one line naming that port and its flag."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.service_support import REPO, tiny_vocab_path  # noqa: F401


def _serve(vocab, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "istanbul", "serve", "--vocab", str(vocab),
                           "--log-format", "text", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def busy_port():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.mark.parametrize("flags, named", [
    (["--port", "{busy}"], "gRPC port 127.0.0.1:{busy} is already in use"),
    (["--port", "0", "--metrics-port", "{busy}"], "metrics port 127.0.0.1:{busy} is already in use"),
])
def test_a_busy_port_is_one_line_naming_it(tiny_vocab_path, busy_port, flags, named):
    done = _serve(tiny_vocab_path, *(f.format(busy=busy_port) for f in flags))
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()
             and "serving with --workers" not in line]    # (the layout, logged first)
    assert len(lines) == 1, done.stderr
    assert named.format(busy=busy_port) in lines[0]
    assert ("--metrics-port" if "metrics" in named else "--port") in lines[0]
    assert "Traceback" not in done.stderr


def test_an_address_of_another_machine_names_the_host_flag(tiny_vocab_path):
    done = _serve(tiny_vocab_path, "--listen-public", "--host", "192.0.2.1", "--port", "0",
                  "--metrics-port", "0")
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if "WARNING" not in line
             and "serving with --workers" not in line]
    assert len(lines) == 1, done.stderr     # (the warning: public without a token)
    assert "gRPC port 192.0.2.1:0 is not an address of this machine" in lines[0]
    assert "--host" in lines[0]
