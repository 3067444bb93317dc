"""The `istanbul` command as a user meets it: commands run in subprocesses with a clean
environment (no XDG_RUNTIME_DIR, no ISTANBUL_* settings), the public `import istanbul` API,
one flag vocabulary with defaults in every --help, loopback by default, optional extras."""

from __future__ import annotations

import ast
import hashlib
import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import shared_vocab
from tests.package_names import product_modules
from tests.service_support import server, tiny_encoding, tiny_vocab_path  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
LAZY_TABLES = ("LAZY_EXPORTS", "COMMAND_MODULES")   # module names imported with importlib
HOUSE = "istanbul.shaders"   # a library below the API, though its import name is inside it
INIT = "istanbul (its __init__ run as a parent package)"


def clean_env(tmp_path: Path, **extra) -> dict:
    """What cron or a bare container gives a process: PATH and little else."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO),
           "HOME": str(tmp_path / "home")}
    env.update(extra)
    return env


def istanbul(tmp_path, *argv, env=None, stdin="", timeout=300, python=()):
    """Run `python -m istanbul ARGV` (or python -c PROGRAM with `python`)."""
    cmd = [sys.executable, *python] if python else [sys.executable, "-m", "istanbul", *argv]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout,
                          cwd=tmp_path, env=env or clean_env(tmp_path))


def without(module: str, *argv: str) -> tuple[str, ...]:
    """python -c: run `istanbul ARGV` with `module` unimportable (as on a plain install)."""
    program = (f"import sys; sys.modules[{module!r}] = None; from istanbul.cli import main; "
               f"raise SystemExit(main({list(argv)!r}))")
    return ("-c", program)


# ---- stray driver noise ------------------------------------------------------------------------

def test_no_driver_noise_without_xdg_runtime_dir(tmp_path):
    done = istanbul(tmp_path, "devices")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("[0] ")
    assert "XDG_RUNTIME_DIR" not in done.stderr + done.stdout
    assert done.stderr == ""


def test_the_private_runtime_dir_is_the_users_alone(tmp_path):
    program = ("import os, stat; from istanbul.shaders.adapters import prepare_driver_environment as p; "
               "p(); d = os.environ['XDG_RUNTIME_DIR']; st = os.stat(d); "
               "print(d, oct(stat.S_IMODE(st.st_mode)), st.st_uid == os.getuid())")
    done = istanbul(tmp_path, python=("-c", program))
    path, mode, mine = done.stdout.split()
    assert Path(path).is_dir() and mode == "0o700" and mine == "True"
    kept = istanbul(tmp_path, python=("-c", program),
                    env=clean_env(tmp_path, XDG_RUNTIME_DIR=str(tmp_path)))
    assert kept.stdout.split()[0] == str(tmp_path)    # a valid directory the user set is kept


# ---- the public API ----------------------------------------------------------------------------

def test_import_istanbul_is_cheap_and_exposes_the_api(tmp_path, tiny_vocab_path):
    program = f"""
import sys, istanbul
heavy = [m for m in ("numpy", "wgpu", "grpc", "torch", "tokenizer_svc", "trainer_svc",
                     "istanbul.shaders")
         if m in sys.modules]
assert heavy == [], heavy
enc = istanbul.get_encoding({str(tiny_vocab_path)!r}, device="cpu")
from tokenizer_svc.encoding import Encoding, get_encoding
from tokenizer_svc.service.client import TokenizerClient
from trainer_svc.model import ModelConfig
from trainer_svc.training.trainer import TrainConfig, Trainer
assert isinstance(enc, istanbul.Encoding) and istanbul.Encoding is Encoding
assert istanbul.get_encoding is get_encoding and istanbul.TokenizerClient is TokenizerClient
assert (istanbul.ModelConfig, istanbul.TrainConfig, istanbul.Trainer) == \\
    (ModelConfig, TrainConfig, Trainer)
assert enc.decode(enc.encode("hello world")) == "hello world"
assert set(istanbul.__all__) <= set(dir(istanbul))
try:
    istanbul.no_such_name
except AttributeError as exc:
    assert "no_such_name" in str(exc)
else:
    raise AssertionError("no AttributeError")
print(enc.encode("hello world"))
"""
    done = istanbul(tmp_path, python=("-c", program))
    assert done.returncode == 0, done.stderr
    from tokenizer_svc.encoding import get_encoding
    assert done.stdout.strip() == str(get_encoding(str(tiny_vocab_path),
                                                   device="cpu").encode("hello world"))


def test_public_api_gives_tiktoken_ids_on_a_real_vocabulary(tmp_path):
    path = shared_vocab("o200k_base.tiktoken")
    done = istanbul(tmp_path, python=("-c", "import istanbul; enc = istanbul.get_encoding("
                                      "'o200k_base', device='cpu'); print(enc.encode('hello "
                                      "world'))"),
                    env=clean_env(tmp_path, ISTANBUL_VOCAB_DIR=str(path.parent)))
    assert done.stdout.strip() == "[24912, 2375]", done.stderr   # istanbul/__init__'s example


def _imports(path: Path, module: str, known: set[str], lazy: bool = True) -> set[str]:
    """Every module `module` imports, function-local and (with `lazy`) lazy ones included (a
    string that names a module in `LAZY_EXPORTS` or COMMAND_MODULES); importing a.b.c imports
    a, a.b."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found, named = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif lazy and isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
                getattr(t, "id", "") in LAZY_TABLES
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])):
            named.update(c.value for c in ast.walk(node.value)      # importlib by name
                         if isinstance(c, ast.Constant) and c.value in known)
    closed = set(named)
    for name in found:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            # istanbul as the parent of what is imported (istanbul.shaders.x) runs its
            # __init__, not its lazy names
            closed.add(INIT if prefix == "istanbul" and i < len(parts) else prefix)
    return closed & (known | {INIT})


def test_no_import_cycle_goes_through_the_istanbul_package():
    modules = product_modules()
    graph = {m: _imports(f, m, set(modules)) - {m} for m, f in modules.items()}
    for m in modules:                                  # a submodule imports its package
        if "." in m:
            graph[m].add(m.rpartition(".")[0])
    assert "tokenizer_svc.encoding" in graph["istanbul"]      # the lazy edges are seen
    # Importing istanbul.shaders runs istanbul/__init__ first: its own imports, not its lazy
    # names (those load on attribute access only). So the house reaches that, not `istanbul`.
    graph[INIT] = _imports(modules["istanbul"], "istanbul", set(modules), lazy=False)
    graph[HOUSE] = graph[HOUSE] - {"istanbul"} | {INIT}
    assert any(INIT in edges for edges in graph.values())    # from istanbul.shaders... import

    def reachable(start):
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    def is_library(m):
        return m == HOUSE or m.startswith(HOUSE + ".") or not (
            m == "istanbul" or m.startswith("istanbul."))
    api = {m for m in modules if not is_library(m)}     # istanbul, istanbul.cli, .demo, ...
    assert graph[INIT] & api == set(), graph[INIT]      # istanbul/__init__ imports no API module
    below = reachable("istanbul")
    assert f"{HOUSE}.engine" in below and "tokenizer_svc.encoding" in below
    back = sorted(m for m in below if is_library(m) and reachable(m) & api)
    assert back == [], f"these libraries import the istanbul package back: {back}"
    assert graph["istanbul_errors"] == set()           # the bottom module imports nothing


# ---- one flag vocabulary -----------------------------------------------------------------------

def _all_parsers():
    from istanbul.cli import build_parser, walk_parsers
    return list(walk_parsers(build_parser()))


def test_every_help_shows_every_default():
    from istanbul.cli import has_default_to_show
    for parser in _all_parsers():
        formatter = parser._get_formatter()
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            if has_default_to_show(action):
                line = formatter._get_help_string(action) % {"default": action.default}
                assert "default" in line, f"{parser.prog} {action.option_strings}: no default"
                assert "".join(line.split()) in "".join(text.split()), (parser.prog, line)
    train = " ".join(next(p for p in _all_parsers() if p.prog == "istanbul train")
                     .format_help().split())
    assert "--weight-decay X AdamW weight decay (default: 0.1)" in train


SAME_IDEA = {  # one name per idea: no command may spell it differently
    "--metrics-addr": "--metrics-host", "--server": "--tokenizer", "--token-file":
    "--auth-token-file", "--server-token-file": "--auth-token-file", "--ca": "--tls-ca",
    "--ca-file": "--tls-ca", "--server-ca": "--tls-ca", "--server-tls": "--tls",
    "--quiet": "--no-progress",
}


def test_one_spelling_per_idea_across_commands():
    for parser in _all_parsers():
        flags = {s for a in parser._actions for s in a.option_strings}
        assert not flags & set(SAME_IDEA), (parser.prog, flags & set(SAME_IDEA))
        if "--metrics-port" in flags:
            assert {"--metrics-host", "--metrics-auth", "--listen-public"} <= flags, parser.prog
        if "--adapter" in flags and parser.prog != "istanbul demo":   # the demo passes it on
            assert "--require-gpu" in flags, parser.prog


def test_spellings_of_earlier_releases_are_unknown_options(capsys):
    """0.1 keeps one spelling per idea: an old one fails under the command's usage."""
    from istanbul.cli import build_parser, parse_args
    with pytest.raises(SystemExit):
        parse_args(build_parser(), ["trainer", "--checkpoints", "ck", "--metrics-addr",
                                    "127.0.0.2"])
    assert "unrecognized arguments: --metrics-addr" in capsys.readouterr().err


def test_train_and_submit_share_their_defaults():
    from istanbul.cli import build_parser
    from trainer_svc.cli_jobs import build_spec_dict
    from trainer_svc.jobs.queue import JobSpec
    parser = build_parser()
    train = parser.parse_args(["train", "--text", "a", "--steps", "100"])
    submit = parser.parse_args(["submit", "--dataset", "d", "--steps", "100"])
    spec = JobSpec.parse(build_spec_dict(submit), origin="test")
    for name in ("warmup", "batch", "lr", "weight_decay", "seed", "grad_accum", "keep_last",
                 "model"):
        assert getattr(train, name) == getattr(spec, name), name


def test_unknown_flag_shows_the_commands_usage_with_a_suggestion(tmp_path):
    done = istanbul(tmp_path, "train", "--text", "a.py", "--stesp", "5")
    assert done.returncode == 2
    assert done.stderr.startswith("usage: istanbul train ")
    assert "unrecognized arguments: --stesp" in done.stderr
    assert "did you mean --steps?" in done.stderr
    done = istanbul(tmp_path, "kernels", "check", "--kernl", "x")
    assert done.stderr.startswith("usage: istanbul kernels check ")
    assert "did you mean --kernel?" in done.stderr


def test_serve_refuses_a_public_address_without_listen_public(tmp_path, tiny_vocab_path):
    done = istanbul(tmp_path, "serve", "--vocab", str(tiny_vocab_path), "--host", "0.0.0.0",
                    "--port", "0")
    assert done.returncode == 1
    assert "--host 0.0.0.0 is not a loopback address; add --listen-public" in done.stderr
    done = istanbul(tmp_path, "serve", "--vocab", str(tiny_vocab_path), "--port", "0",
                    "--metrics-port", "0", "--metrics-host", "10.1.2.3")
    assert done.returncode == 1 and "--metrics-host 10.1.2.3" in done.stderr
    done = istanbul(tmp_path, "serve", "--vocab", str(tiny_vocab_path), "--metrics-auth")
    assert done.returncode == 1 and "--metrics-auth needs --auth-token-file" in done.stderr
    done = istanbul(tmp_path, "trainer", "--checkpoints", "ck", "--metrics-port", "0",
                    "--metrics-host", "0.0.0.0")
    assert done.returncode == 1 and "add --listen-public" in done.stderr


def _non_loopback_address() -> str | None:
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))      # no packet is sent: it only picks a route
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_serve_listens_on_loopback_only_by_default(tmp_path, tiny_vocab_path):
    import json
    import signal
    import socket
    import time
    port_file = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, "-m", "istanbul", "serve", "--vocab",
                             str(tiny_vocab_path), "--port", "0", "--port-file", str(port_file),
                             "--metrics-port", "0"], cwd=tmp_path, env=clean_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.1)
        port = int(port_file.read_text())
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        other = _non_loopback_address()
        if other is not None:           # the same port on another interface: nobody there
            with pytest.raises(OSError):
                socket.create_connection((other, port), timeout=5).close()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    listening = next(json.loads(line) for line in err.splitlines()
                     if '"listening"' in line)
    assert listening["address"] == f"127.0.0.1:{port}", listening
    assert proc.returncode == 0, err


def test_bind_addresses_default_to_loopback():
    from istanbul_errors import UserFacingError
    from tokenizer_svc.exposure import bind_address
    from tokenizer_svc.service.config import ServerConfig
    assert bind_address(None, "--host", public=False) == "127.0.0.1"
    assert bind_address(None, "--host", public=True) == "0.0.0.0"
    for host in ("127.0.0.1", "::1", "[::1]", "localhost", "127.3.4.5"):
        assert bind_address(host, "--host", public=False) == host
    for host in ("0.0.0.0", "::", "192.168.1.5", "example.org"):
        with pytest.raises(UserFacingError, match="--listen-public"):
            bind_address(host, "--host", public=False)
        assert bind_address(host, "--host", public=True) == host
    assert ServerConfig().host == ServerConfig().metrics_host == "127.0.0.1"


def test_metrics_endpoint_behind_a_bearer_token():
    import urllib.error
    import urllib.request
    from prometheus_client import CollectorRegistry, Counter
    from tokenizer_svc.exposure import serve_metrics
    registry = CollectorRegistry()
    Counter("istanbul_test_things", "things", registry=registry).inc(3)

    def get(port, token=None):
        request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, ""
    guarded = serve_metrics(registry, "127.0.0.1", 0, tokens=("alpha", "beta"))
    open_ = serve_metrics(registry, "127.0.0.1", 0)
    try:
        assert get(guarded.server_port)[0] == 401
        assert get(guarded.server_port, "gamma")[0] == 401
        for token in ("alpha", "beta"):
            status, page = get(guarded.server_port, token)
            assert status == 200 and "istanbul_test_things_total 3.0" in page
        assert get(open_.server_port)[0] == 200
    finally:
        for srv in (guarded, open_):
            srv.shutdown()
            srv.server_close()


def test_no_progress_bar_lines_without_a_terminal(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((REPO / "README.md").read_text(encoding="utf-8"))
    done = istanbul(tmp_path, "vocab", "train", str(corpus), "--size", "300", "--trainer",
                    "cpu", "-o", str(tmp_path / "v.tiktoken"))
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr and "merge/s" not in done.stderr
    assert "pre-tokenizing" not in done.stderr


# ---- adapters: reported, and a GPU can be required -----------------------------------------------

def test_require_gpu_refuses_software_vulkan(tmp_path, device):
    argv = ("kernels", "check", "--kernel", "gelu_backward", "--require-gpu")
    done = istanbul(tmp_path, *argv)
    if not device.info.is_software:
        assert done.returncode == 0, done.stderr
        return
    assert done.returncode == 1 and "gelu_backward" not in done.stdout
    assert "--require-gpu: the adapter is software Vulkan, not a GPU" in done.stderr
    daemon = subprocess.run([sys.executable, "-m", "trainer_svc", "--checkpoints", "ck",
                             "--require-gpu"], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path, env=clean_env(tmp_path))
    assert daemon.returncode == 1 and "software Vulkan, not a GPU" in daemon.stderr


def test_trainer_metrics_behind_the_token_name_the_adapter(tmp_path, redis_server, device):
    import re
    import time
    import urllib.error
    import urllib.request
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("# one per line\nmetrics-token\n")
    log = tmp_path / "daemon.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "trainer_svc", "--checkpoints",
                                 str(tmp_path / "ck"), "--redis", redis_server.url,
                                 "--metrics-port", "0", "--metrics-auth", "--auth-token-file",
                                 str(tokens)], cwd=tmp_path, env=clean_env(tmp_path),
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not (found := re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics) "
                                      r"\(bearer token required\)", log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        url = found.group(1)
        with pytest.raises(urllib.error.HTTPError, match="401"):
            urllib.request.urlopen(url, timeout=10)
        request = urllib.request.Request(url, headers={"Authorization": "Bearer metrics-token"})
        page = urllib.request.urlopen(request, timeout=10).read().decode()
        line = re.search(r"^istanbul_trainer_adapter\{(.*)\} 1\.0$", page, re.M)
        assert line, page
        assert dict(re.findall(r'(\w+)="([^"]*)"', line.group(1))) == {
            "adapter": device.info.name, "type": device.info.adapter_type,
            "software": "true" if device.info.is_software else "false"}
        health = istanbul(tmp_path, "health", url, "--auth-token-file", str(tokens))
        assert health.returncode == 0 and health.stdout.startswith(f"{url}: UP (adapter "), \
            health.stderr
        assert istanbul(tmp_path, "health", url).returncode == 1     # 401: not healthy
    finally:
        proc.send_signal(2)
        assert proc.wait(60) == 0, log.read_text()


def test_get_info_says_whether_the_adapter_is_software(server, device):  # noqa: F811
    from tokenizer_svc.service.client import TokenizerClient
    with TokenizerClient(server.target) as client:
        adapter = client.info().adapter
    assert adapter.name == device.info.name
    assert adapter.software is device.info.is_software


def test_job_status_names_the_adapter(tmp_path, redis_server):
    import json
    from trainer_svc.jobs import keys
    from trainer_svc.jobs.daemon import adapter_label

    class Info:
        name, adapter_type, is_software = "llvmpipe", "CPU", True
    assert adapter_label(type("D", (), {"info": Info()})()) == "llvmpipe (software Vulkan)"
    assert adapter_label(None) == ""
    redis_server.client().hset(keys.job("j-adapter"), mapping={
        "id": "j-adapter", "state": "running", "step": "3", "total_steps": "10",
        "dataset": "d", "model": "tiny", "spec": "{}", "adapter": "NVIDIA H200 (DiscreteGPU)"})
    done = istanbul(tmp_path, "status", "j-adapter", "--redis", redis_server.url)
    assert done.returncode == 0, done.stderr
    assert "  adapter NVIDIA H200 (DiscreteGPU)" in done.stdout.splitlines()
    done = istanbul(tmp_path, "status", "j-adapter", "--json", "--redis", redis_server.url)
    assert json.loads(done.stdout)["adapter"] == "NVIDIA H200 (DiscreteGPU)"


# ---- optional extras ---------------------------------------------------------------------------

def test_kernels_check_skips_the_autograd_rung_without_torch(tmp_path):
    done = istanbul(tmp_path, python=without("torch", "kernels", "check", "--kernel",
                                             "gelu_backward"))
    assert done.returncode == 0, done.stdout + done.stderr
    grad = [line for line in done.stdout.splitlines() if " grad " in line]
    assert grad and all(" skip " in line and "istanbul[check]" in line for line in grad)
    assert "FAIL" not in done.stdout
    assert "rung(s) skipped: the autograd reference needs PyTorch" in done.stdout


def test_demo_without_matplotlib_says_which_extra_to_install(tmp_path):
    done = istanbul(tmp_path, python=without("matplotlib", "demo", "--out",
                                             str(tmp_path / "demo")))
    assert done.returncode == 1
    assert "needs matplotlib, an optional extra that is not installed: pip install " \
           "'istanbul[plot]'" in done.stderr
    assert not (tmp_path / "demo" / "vocab").exists()       # refused before any work


# ---- vocabularies ------------------------------------------------------------------------------

def test_vocabulary_not_found_says_what_where_and_how(tmp_path):
    done = istanbul(tmp_path, "encode", "--vocab", "cl100k_base", "--cpu", stdin="hi",
                    env=clean_env(tmp_path, TIKTOKEN_CACHE_DIR=str(tmp_path / "tc")))
    assert done.returncode == 1
    err = done.stderr
    assert "expected cl100k_base.tiktoken" in err
    assert "$ISTANBUL_VOCAB_DIR (not set)" in err
    assert str(tmp_path / "home" / ".cache" / "istanbul" / "vocab" / "cl100k_base.tiktoken") in err
    url = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
    assert str(tmp_path / "tc" / hashlib.sha1(url.encode()).hexdigest()) in err
    assert url in err and "istanbul vocab fetch cl100k_base" in err and "--from" in err


def test_vocab_fetch_from_a_file_a_tiktoken_cache_and_a_url(tmp_path):
    real = shared_vocab("gpt2.tiktoken")
    vocab_dir = tmp_path / "vocab"
    env = clean_env(tmp_path, ISTANBUL_VOCAB_DIR=str(vocab_dir))
    done = istanbul(tmp_path, "vocab", "fetch", "gpt2", "--from", str(real), env=env)
    assert done.returncode == 0, done.stderr
    assert (vocab_dir / "gpt2.tiktoken").read_bytes() == real.read_bytes()
    enc = istanbul(tmp_path, "encode", "--vocab", "gpt2", "--cpu", stdin="hello", env=env)
    assert enc.stdout.strip() == "[31373]", enc.stderr
    # from tiktoken's cache (the file tiktoken names by sha1 of its URL)
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    url = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
    (cache / hashlib.sha1(url.encode()).hexdigest()).write_bytes(real.read_bytes())
    done = istanbul(tmp_path, "vocab", "fetch", "r50k_base", "--to", str(tmp_path / "b"),
                    env=clean_env(tmp_path, TIKTOKEN_CACHE_DIR=str(cache)))
    assert done.returncode == 0 and "tiktoken's cache" in done.stdout, done.stderr
    assert (tmp_path / "b" / "r50k_base.tiktoken").is_file()
    # from a URL (a loopback HTTP server: no internet in tests)
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(real.parent))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        done = istanbul(tmp_path, "vocab", "fetch", "gpt2", "--to", str(tmp_path / "c"),
                        "--from", f"http://127.0.0.1:{httpd.server_port}/gpt2.tiktoken")
    finally:
        httpd.shutdown()
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "c" / "gpt2.tiktoken").read_bytes() == real.read_bytes()


def test_vocab_fetch_refuses_a_file_that_is_not_the_published_one(tmp_path):
    fake = tmp_path / "o200k_base.tiktoken"
    fake.write_bytes(b"aGk= 0\n")
    done = istanbul(tmp_path, "vocab", "fetch", "o200k_base", "--from", str(tmp_path),
                    "--to", str(tmp_path / "out"))
    assert done.returncode == 1
    assert "is not the published hash of o200k_base.tiktoken" in done.stderr
    assert "Nothing was written" in done.stderr
    assert not (tmp_path / "out" / "o200k_base.tiktoken").exists()
    done = istanbul(tmp_path, "vocab", "fetch", "o200k_base", "--from", str(tmp_path / "nope"))
    assert done.returncode == 1 and "no o200k_base.tiktoken there" in done.stderr
    done = istanbul(tmp_path, "vocab", "fetch", "p50k_base")
    assert done.returncode == 2 and "invalid choice" in done.stderr


def test_argparse_types_are_paths_where_paths_are_meant():
    for parser in _all_parsers():
        for action in parser._actions:
            if set(action.option_strings) & {"--auth-token-file", "--tls-ca"}:
                assert action.type is Path, (parser.prog, action.option_strings)
