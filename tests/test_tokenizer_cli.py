"""`istanbul encode` / `istanbul decode` through the real entry point (in process)."""

from __future__ import annotations

import io
import json
import sys

import pytest

from istanbul.cli import main

from .tokenizer_support import tiktoken_twin, trained_vocab_path, vocabulary_for


def run(argv, stdin: bytes, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_encode_decode_round_trip(monkeypatch, capsys):
    path = str(trained_vocab_path("o200k"))
    tik = tiktoken_twin(vocabulary_for("trained-o200k"))
    text = "héllo wörld, don't panic\n日本語 42\n"
    code, out, _ = run(["encode", "--vocab", path], text.encode(), monkeypatch, capsys)
    assert code == 0 and json.loads(out) == tik.encode_ordinary(text)
    code, out2, _ = run(["decode", "--vocab", path], out.encode(), monkeypatch, capsys)
    assert code == 0 and out2 == text


def test_jsonl_documents(monkeypatch, capsys):
    path = str(trained_vocab_path("cl100k"))
    tik = tiktoken_twin(vocabulary_for("trained-cl100k"))
    docs = ["first doc", "", "third <|endoftext|> doc"]
    stdin = "".join(json.dumps(d) + "\n" for d in docs).encode()
    code, out, _ = run(["encode", "--vocab", path, "--jsonl", "--special", "allow"], stdin,
                       monkeypatch, capsys)
    arrays = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and arrays == [tik.encode(d, allowed_special="all") for d in docs]
    stdin = "".join(json.dumps(a) + "\n" for a in arrays).encode()
    code, out, _ = run(["decode", "--vocab", path, "--jsonl"], stdin, monkeypatch, capsys)
    assert code == 0 and [json.loads(line) for line in out.splitlines()] == docs


def test_errors_are_one_clear_line(monkeypatch, capsys):
    path = str(trained_vocab_path("gpt2"))
    code, _, err = run(["encode", "--vocab", path], b"x <|endoftext|>", monkeypatch, capsys)
    assert code == 1 and "disallowed special token" in err and "--special" in err
    code, _, err = run(["decode", "--vocab", path], b"[1, 99999999]", monkeypatch, capsys)
    assert code == 1 and "99999999" in err and "position 1" in err
    code, _, err = run(["decode", "--vocab", path], b"[1, 2", monkeypatch, capsys)
    assert code == 1 and "not JSON" in err
    code, _, err = run(["encode", "--vocab", "no-such-vocab"], b"x", monkeypatch, capsys)
    assert code == 1 and "no-such-vocab" in err
    code, _, err = run(["encode", "--vocab", path, "--jsonl"], b"[1]\n", monkeypatch, capsys)
    assert code == 1 and "line 1" in err
