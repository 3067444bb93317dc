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
    from shaders.engine import default_device
    return default_device()


def shared_vocab(name: str) -> Path:
    """Path of a real vocabulary in ../shared/vocab, or skip the test saying it is absent."""
    path = SHARED_VOCAB / name
    if not path.is_file():
        pytest.skip(f"real vocabulary {name} not present at {path} (../shared/vocab is absent "
                    "on this machine); the project-trained vocabularies still test exactness")
    return path
