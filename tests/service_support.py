"""Shared pieces of the service tests (tests/test_service_*.py).

A tiny byte-level BPE vocabulary is trained here (with tests.tokenizer_support's trainer)
from a small multilingual sample, so the service tests never depend on ../shared; the real
Encoding runs it on the session's wgpu device. Servers are real grpc.aio servers on loopback ports; clients are the real client.
Import the fixtures into a test module by name (`from tests.service_support import ...`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tokenizer_support import MULTILINGUAL, TRICKY, train_bpe
from tokenizer_svc.patterns import GPT2_PATTERN
from tokenizer_svc.vocab import Vocabulary, save_vocabulary

REPO = Path(__file__).resolve().parents[1]

SAMPLE = """\
İstanbul'da sabah erkenden vapura bindik; martılar simit için çığlık atıyordu.
Öğrenciler GPU çekirdeklerini WGSL ile yazıyor, her çekirdeği yavaş bir referansla karşılaştırıyor.
The quick brown fox jumps over the lazy dog. The tokenizer merges the most frequent pairs first.
def tokenize(text: str) -> list[int]:
    return [ranks[piece] for piece in pattern.findall(text)]
Numbers like 12345, 2024-11-30 and 3.14159 should split into digit runs.
Ünicode: ğüşöçı ĞÜŞÖÇİ — “quotes”, emoji 🙂🚀, 日本語のテキスト, Ελληνικά, русский текст.
    indented    with    many     spaces and\ttabs\nand newlines\n\n\n
"""

SPECIALS = ("<|endoftext|>", "<|fim|>")

# Texts that exercise the pre-tokenizer and BPE: Unicode, whitespace and digit runs, empty.
TEXTS = [
    "",
    "hello world",
    "İstanbul'da sabah erkenden vapura bindik",
    "The tokenizer merges the most frequent pairs first.",
    "   leading and trailing spaces   ",
    "tabs\tand\nnewlines\r\n\n  end",
    "1234567890 3.14159 2024-11-30",
    "emoji 🙂🚀 日本語のテキスト Ελληνικά русский",
    "a" * 300,
    " " * 50 + "x",
    "def f(x):\n    return x ** 2  # square\n",
    MULTILINGUAL[12], MULTILINGUAL[13], MULTILINGUAL[14],  # emoji ZWJ, combining, contractions
    TRICKY[26], TRICKY[28],  # whitespace and newline mixes
]


def write_tiny_vocabulary(directory: Path) -> Path:
    ranks = train_bpe([SAMPLE] * 3 + MULTILINGUAL, GPT2_PATTERN, 300)
    specials = {text: len(ranks) + k for k, text in enumerate(SPECIALS)}
    path = Path(directory) / "tiny.tiktoken"
    save_vocabulary(Vocabulary(name="tiny", ranks=ranks, pattern=GPT2_PATTERN,
                               pattern_name="gpt2", special_tokens=specials), path)
    return path


@pytest.fixture(scope="session")
def tiny_vocab_path(tmp_path_factory) -> Path:
    return write_tiny_vocabulary(tmp_path_factory.mktemp("vocab"))


@pytest.fixture(scope="session")
def tiny_encoding(device, tiny_vocab_path):
    from tokenizer_svc.encoding import get_encoding
    return get_encoding(str(tiny_vocab_path), device=device)


def start_server(encoding, device=None, **config):
    """A started BackgroundServer on a free loopback port (use as a context manager)."""
    from tokenizer_svc.service import BackgroundServer, ServerConfig
    config.setdefault("host", "127.0.0.1")
    config.setdefault("port", 0)
    return BackgroundServer(ServerConfig(**config), encoding=encoding, device=device).start()


@pytest.fixture(scope="module")
def server(tiny_encoding, device):
    srv = start_server(tiny_encoding, device)
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    from tokenizer_svc.service.client import TokenizerClient
    with TokenizerClient(server.target, timeout=60) as c:
        yield c


def stub_for(target: str):
    import grpc
    from tokenizer_svc.service.rpc import tokenizer_pb2_grpc
    channel = grpc.insecure_channel(target)
    return channel, tokenizer_pb2_grpc.TokenizerStub(channel)


def metric(server, name: str, **labels) -> float:
    """A sample of the server's Prometheus registry (0 when it has not been recorded yet)."""
    value = server.server.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def reason_of(rpc_error) -> str:
    return dict(rpc_error.trailing_metadata() or ()).get("istanbul-error", "")


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_subprocess(*args: str, env: dict | None = None) -> subprocess.Popen:
    """`python -m tokenizer_svc ARGS` with stderr (the JSON log) captured."""
    full_env = {**os.environ, "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", "/tmp"),
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                            os.environ.get("PYTHONPATH")])),
                **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "tokenizer_svc", *args], cwd=REPO,
                            env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
