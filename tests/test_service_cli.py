"""`--tokenizer HOST:PORT` for the istanbul commands: the options and the client they make."""

from __future__ import annotations

import argparse
import json

import pytest

from istanbul.errors import UserFacingError
from tokenizer_svc.service.client_options import add_tokenizer_arguments, client_from_args
from tests.service_support import (TEXTS, free_port, server, tiny_encoding,  # noqa: F401
                                   tiny_vocab_path)


def _parse(*argv):
    parser = argparse.ArgumentParser()
    add_tokenizer_arguments(parser)
    return parser.parse_args(argv)


def test_server_option_gives_a_client_equal_to_the_local_encoding(server, tiny_encoding):
    client = client_from_args(_parse("--tokenizer", server.target))
    try:
        for text in TEXTS:
            assert client.encode(text) == list(tiny_encoding.encode(text))
            assert client.decode(client.encode(text)) == tiny_encoding.decode(
                tiny_encoding.encode(text))
    finally:
        client.close()


def test_unreachable_server_is_a_clear_user_error():
    args = _parse("--tokenizer", f"127.0.0.1:{free_port()}")
    with pytest.raises(UserFacingError, match=r"tokenizer service at 127\.0\.0\.1:\d+ \(--tokenizer\): .*istanbul serve"):
        client_from_args(args)


# ---- `istanbul encode/decode --tokenizer` against `--vocab` ---------------------------------------

def _cli(monkeypatch, argv: list[str], stdin: bytes) -> tuple[int, bytes, str]:
    """Run `istanbul ARGV` in this process with bytes on stdin; (exit code, stdout, stderr)."""
    import io
    import sys
    from istanbul.cli import main
    out = io.BytesIO()
    stdout = io.TextIOWrapper(out, encoding="utf-8", newline="")
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    monkeypatch.setattr(sys, "stdout", stdout)
    monkeypatch.setattr(sys, "stderr", stderr)
    code = main(argv)
    stdout.flush()
    return code, out.getvalue(), stderr.getvalue()


SPECIAL = "before <|endoftext|> after <|fim|>"
CASES = [
    (["encode"], "\n".join(TEXTS).encode()),
    (["encode", "--special", "allow"], SPECIAL.encode()),
    (["encode", "--special", "text"], SPECIAL.encode()),
    (["encode"], SPECIAL.encode()),                                    # refused: same error
    (["encode"], b"raw \xff\xfe bytes"),                               # invalid UTF-8 stdin
    (["encode", "--jsonl"], "\n".join(json.dumps(t) for t in TEXTS).encode()),
    (["encode", "--jsonl", "--special", "allow"],
     "\n".join(json.dumps(t) for t in ["a", SPECIAL, "b"]).encode()),
    (["encode", "--jsonl"], "\n".join(json.dumps(t) for t in ["a", "b", SPECIAL]).encode()),
    (["encode", "--chunk", "5", "--overlap", "2"], "\n".join(TEXTS).encode()),
    (["encode", "--chunk", "3", "--jsonl", "--special", "allow"],
     "\n".join(json.dumps(t) for t in ["a", SPECIAL, "", "İstanbul 🙂"]).encode()),
    (["encode", "--chunk", "4"], SPECIAL.encode()),                   # refused: same error
    (["encode", "--chunk", "4", "--overlap", "1"], b"raw \xff\xfe bytes " * 5),
    (["encode", "--chunk", "2", "--overlap", "2"], b"x"),             # refused: overlap
    (["decode"], b"[1, 2, 3, 100, 200]"),
    (["decode", "--errors", "strict"], b"[255]"),                      # refused: not UTF-8
    (["decode"], b"[255, 254]"),
    (["decode"], b"[1, 2, 999999]"),                                   # refused: invalid id
    (["decode", "--jsonl"], b"[1, 2]\n[3, 999999]\n"),
]


@pytest.mark.parametrize("argv, stdin", CASES)
def test_server_output_is_identical_to_the_local_vocabulary(monkeypatch, server,
                                                            tiny_vocab_path, argv, stdin):
    local = _cli(monkeypatch, [*argv, "--vocab", str(tiny_vocab_path)], stdin)
    remote = _cli(monkeypatch, [*argv, "--tokenizer", server.target], stdin)
    assert remote == local
    assert local[0] in (0, 1)
    if local[0]:
        assert "error:" in local[2] and "Traceback" not in local[2]


def test_encode_needs_a_vocabulary_or_a_server(monkeypatch):
    code, _, err = _cli(monkeypatch, ["encode"], b"hi")
    assert code == 1 and "--vocab" in err and "--tokenizer" in err


def test_health_command_for_container_healthchecks(monkeypatch, server):
    from istanbul.shaders.engine import default_device
    info = default_device().info    # the fixture's server encodes on the default device
    code, out, _ = _cli(monkeypatch, ["health", server.target], b"")
    software = ", software Vulkan" if info.is_software else ""
    assert code == 0 and out.decode().strip() == (
        f"{server.target}: SERVING (adapter {info.name}, {info.adapter_type}{software})")
    code, _, err = _cli(monkeypatch, ["health", server.target, "--service", "no.such.Service"],
                        b"")
    assert code == 1 and "NOT_FOUND" in err
    code, _, err = _cli(monkeypatch, ["health", f"127.0.0.1:{free_port()}", "--timeout", "1"],
                        b"")
    assert code == 1 and ("UNAVAILABLE" in err or "DEADLINE_EXCEEDED" in err)
