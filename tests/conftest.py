"""Shared fixtures: one real wgpu device per test session (lavapipe on CI), vocab paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # Mesa's software drivers warn without it

REPO = Path(__file__).resolve().parents[1]
SHARED_VOCAB = Path(os.environ.get("ISTANBUL_SHARED_VOCAB", REPO.parent / "shared" / "vocab"))


@pytest.fixture(scope="session")
def device():
    from istanbul.shaders.engine import default_device
    return default_device()


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private autotune cache ($ISTANBUL_AUTOTUNE_DIR) for the test, its memo forgotten."""
    from istanbul.shaders import tuned_cache
    monkeypatch.setenv("ISTANBUL_AUTOTUNE_DIR", str(tmp_path))
    tuned_cache.forget()
    yield tmp_path
    tuned_cache.forget()


def shared_vocab(name: str) -> Path:
    """Path of a real vocabulary in ../shared/vocab, or skip the test saying it is absent."""
    path = SHARED_VOCAB / name
    if not path.is_file():
        pytest.skip(f"real vocabulary {name} not present at {path} (../shared/vocab is absent "
                    "on this machine); the project-trained vocabularies still test exactness")
    return path


def pytest_configure(config):
    config.addinivalue_line("markers", "redis: uses a real Redis server (the redis_server "
                                       "fixture); $ISTANBUL_TEST_REDIS picks which")


def pytest_report_header(config):
    from .redis_helpers import redis_binary, redis_kind, redis_version
    try:
        binary = redis_binary()
        return f"redis for tests: {redis_kind()}: {binary} ({redis_version(binary)})"
    except Exception as exc:  # reported again, as an error, by the tests that need it
        return f"redis for tests: unavailable ({exc})"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "redis_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.redis)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    """A real Redis server for one test module ($ISTANBUL_TEST_REDIS: embedded or system)."""
    from .redis_helpers import RedisServer
    srv = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield srv
    srv.stop()


@pytest.fixture
def handle(redis_server):
    """A connection to `redis_server`, its database emptied for each test."""
    from trainer_svc.jobs.redis_conn import connect
    h = connect(redis_server.url)
    h.text.flushdb()
    yield h
    h.close()
