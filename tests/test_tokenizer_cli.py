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


@pytest.mark.parametrize("where", [[], ["--cpu"]])
def test_jsonl_takes_strings_and_text_objects(monkeypatch, capsys, where):
    path = str(trained_vocab_path("cl100k"))
    tik = tiktoken_twin(vocabulary_for("trained-cl100k"))
    docs = ["a bare string", "an object's text", "", "ünïcode 日本語"]
    lines = [json.dumps(docs[0]),
             json.dumps({"id": 7, "text": docs[1], "meta": {"text": "not this"}}),
             json.dumps({"text": docs[2]}),
             json.dumps(docs[3], ensure_ascii=False)]
    stdin = ("\n".join(lines) + "\n").encode()
    code, out, err = run(["encode", "--vocab", path, "--jsonl", *where], stdin, monkeypatch,
                         capsys)
    assert code == 0, err
    assert [json.loads(line) for line in out.splitlines()] == [tik.encode(d) for d in docs]
    # another field, by --text-field
    stdin = (json.dumps({"content": docs[1]}) + "\n" + json.dumps(docs[0]) + "\n").encode()
    code, out, err = run(["encode", "--vocab", path, "--jsonl", "--text-field", "content",
                          *where], stdin, monkeypatch, capsys)
    assert code == 0, err
    assert [json.loads(line) for line in out.splitlines()] == [tik.encode(docs[1]),
                                                               tik.encode(docs[0])]


@pytest.mark.parametrize("bad,needles", [
    ('{"body": "x"}', ['no field "text"', '"body"', "--text-field"]),
    ('{"text": 42}', ['field "text" is a JSON number, not a string']),
    ('{"text": null}', ['field "text" is a JSON null, not a string']),
    ('["a", "b"]', ["a JSON array", 'an object with a string field "text"']),
    ("17", ["a JSON number"]),
    ('{"text": "x"', ["not JSON", 'a JSON string or an object with a string field "text"']),
])
def test_jsonl_bad_line_is_named(monkeypatch, capsys, bad, needles):
    path = str(trained_vocab_path("cl100k"))
    stdin = (json.dumps("fine") + "\n\n" + json.dumps({"text": "fine"}) + "\n" + bad
             + "\n").encode()
    code, out, err = run(["encode", "--vocab", path, "--jsonl", "--cpu"], stdin, monkeypatch,
                         capsys)
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1 and "stdin line 4:" in err, err
    for needle in needles:
        assert needle in err, err


def test_text_field_needs_jsonl(monkeypatch, capsys):
    path = str(trained_vocab_path("cl100k"))
    code, out, err = run(["encode", "--vocab", path, "--text-field", "body", "--cpu"], b"x",
                         monkeypatch, capsys)
    assert code == 1 and out == "" and "--text-field" in err and "--jsonl" in err


def test_chunk_windows_are_tiktokens_ids_with_their_spans(monkeypatch, capsys):
    path = str(trained_vocab_path("cl100k"))
    tik = tiktoken_twin(vocabulary_for("trained-cl100k"))
    text = "Retrieval pipelines embed windows of tokens. İstanbul 🙂 日本語. " * 8
    code, out, _ = run(["encode", "--vocab", path, "--chunk", "16", "--overlap", "4"],
                       text.encode(), monkeypatch, capsys)
    assert code == 0
    windows = [json.loads(line) for line in out.splitlines()]
    ids = tik.encode_ordinary(text)
    starts = list(range(0, max(len(ids) - 4, 1), 12))
    assert [w["ids"] for w in windows] == [ids[s:s + 16] for s in starts]
    for w in windows:
        assert w["document"] == 0 and w["text"] == text[w["start"]:w["end"]]
        assert tik.decode_bytes(w["ids"]) == text.encode()[w["byte_start"]:w["byte_end"]]


@pytest.mark.parametrize("argv, needle", [
    (["--chunk", "0"], "--chunk must be"), (["--chunk", "4", "--overlap", "4"], "--overlap must"),
    (["--overlap", "2"], "add --chunk N"),
])
def test_chunk_arguments_are_checked_first(monkeypatch, capsys, argv, needle):
    code, _, err = run(["encode", "--vocab", str(trained_vocab_path("cl100k")), *argv], b"x",
                       monkeypatch, capsys)
    assert code == 1 and needle in err and "Traceback" not in err

