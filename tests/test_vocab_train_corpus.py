"""Corpus reading: streamed (and parallel) pre-tokenization equals a whole-text scan; bad files.

The oracle is `regex.findall(pattern, whole_text)` after cutting at special tokens, i.e. the
definition in tokenizer_svc/training/corpus.py.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenizer_svc.patterns import PATTERNS
from tokenizer_svc.training.corpus import (CorpusError, Pretokenizer, align_forward,
                                           count_pieces, utf8_cut)

SMALL_CHUNK = 4 * Pretokenizer(PATTERNS["gpt2"]).margin  # the smallest chunk allowed


def whole_text_pieces(text: str, pattern: str, specials=()) -> dict:
    parts = [text]
    if specials:
        alternation = "|".join(regex.escape(s) for s in sorted(specials, key=len, reverse=True))
        parts = regex.split(alternation, text)
    found = Counter()
    for part in parts:
        found.update(m.encode("utf-8", "surrogateescape") for m in regex.findall(pattern, part)
                     if m)
    return dict(found)


ADVERSARIAL = (
    "Hello world's  fine   \r\n\r\n  tabs\t\there 12345678 digits ünïcödé 日本語テキスト "
    + "a" * 700 + " " * 500 + "\n" * 300 + "x" + "=" * 400 + "'ll've're " * 30
    + "HELLOworld WORLD's naïve " * 20 + "🙂🙃 emoji\u200b zero width " * 20 + "   end   ")

texts = st.lists(st.sampled_from(list("ab AB'\n\r\t1é日🙂.,-_ ") +
                                 ["ll", "'re", "  ", "\r\n", "a" * 80, " " * 90, "7" * 50]),
                 max_size=120).map("".join)


@pytest.mark.parametrize("pattern", ["gpt2", "cl100k", "o200k"])
def test_streamed_chunks_equal_a_whole_file_scan(tmp_path, pattern):
    path = tmp_path / "corpus.txt"
    text = ADVERSARIAL * 3
    path.write_text(text, encoding="utf-8")
    want = whole_text_pieces(text, PATTERNS[pattern])
    for chunk in (SMALL_CHUNK, SMALL_CHUNK + 1, 1001, 1 << 20):
        got = count_pieces([path], PATTERNS[pattern], chunk_bytes=chunk)
        assert got.pieces == want, f"chunk {chunk}"
        assert got.occurrences == sum(want.values())
        assert got.bytes_read == len(text.encode())


@pytest.mark.parametrize("pattern", ["gpt2", "cl100k", "o200k"])
@pytest.mark.parametrize("text", [
    "\r\n" + " " * 270 + "\r\n",           # found by the random test below (o200k)
    "x\n" + " \t" * 300 + "\n\ny",
    "word " + " " * 1000 + "\r\n" + " " * 500,
])
def test_streaming_keeps_whitespace_runs_longer_than_a_chunk_whole(tmp_path, text, pattern):
    r"""A whitespace run that crosses a chunk edge is one region: its pieces (\s*[\r\n]+
    spans spaces between newlines) depend on where the run ends."""
    path = tmp_path / "ws.txt"
    path.write_bytes(text.encode("utf-8"))
    got = count_pieces([path], PATTERNS[pattern], chunk_bytes=SMALL_CHUNK)
    assert got.pieces == whole_text_pieces(text, PATTERNS[pattern])


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts, pattern=st.sampled_from(["gpt2", "cl100k", "o200k"]))
def test_streaming_equals_whole_scan_on_random_text(tmp_path, text, pattern):
    path = tmp_path / "random.txt"
    path.write_bytes(text.encode("utf-8"))
    got = count_pieces([path], PATTERNS[pattern], chunk_bytes=SMALL_CHUNK)
    assert got.pieces == whole_text_pieces(text, PATTERNS[pattern])


def test_parallel_chunks_equal_the_sequential_scan(tmp_path):
    # several files, chunks cut mid-character, a special token across a chunk edge, and a
    # piece longer than a chunk's head (the main process scans that chunk itself)
    files, texts = [], []
    for i in range(3):
        text = (ADVERSARIAL + "<|endoftext|>") * (4 + i) + "z" * 9000 + ADVERSARIAL
        path = tmp_path / f"part{i}.txt"
        path.write_text(text, encoding="utf-8")
        files.append(path)
        texts.append(text)
    specials = ["<|endoftext|>", "<|pad|>"]
    want = Counter()
    for text in texts:
        want.update(whole_text_pieces(text, PATTERNS["o200k"], specials))
    seq = count_pieces(files, PATTERNS["o200k"], specials, workers=1, chunk_bytes=1500)
    par = count_pieces(files, PATTERNS["o200k"], specials, workers=2, chunk_bytes=1500)
    assert seq.pieces == dict(want)
    assert par.pieces == dict(want)
    assert par.occurrences == seq.occurrences and par.specials_seen == seq.specials_seen
    assert seq.specials_seen == sum(t.count("<|endoftext|>") for t in texts)
    assert par.fallback_chunks >= 1  # the 9,000-letter piece spans whole chunks


def test_special_tokens_cut_the_text_and_are_not_pieces(tmp_path):
    path = tmp_path / "s.txt"
    path.write_text("ab<|endoftext|>cd <|endoftext|><|endoftext|>ab", encoding="utf-8")
    got = count_pieces([path], PATTERNS["gpt2"], ["<|endoftext|>"])
    assert got.pieces == {b"ab": 2, b"cd": 1, b" ": 1}
    assert got.specials_seen == 3
    plain = count_pieces([path], PATTERNS["gpt2"])
    assert b"endoftext" in plain.pieces


def test_invalid_utf8_is_an_error_naming_file_and_offset(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"good text " * 50 + b"\xff\xfe bad")
    with pytest.raises(CorpusError, match=r"bad\.txt: invalid UTF-8 at byte 500 .*--invalid-utf8 keep"):
        count_pieces([path], PATTERNS["gpt2"], chunk_bytes=SMALL_CHUNK)


def test_invalid_utf8_keep_trains_on_the_bytes(tmp_path):
    raw = b"caf\xe9 \xff\xfe!! ok \xe2\x82 x \xf0\x9f\x99\x82"  # latin-1, junk, cut sequence
    path = tmp_path / "latin1.txt"
    path.write_bytes(raw * 40)
    got = count_pieces([path], PATTERNS["gpt2"], invalid_utf8="keep", chunk_bytes=SMALL_CHUNK)
    assert got.pieces == whole_text_pieces((raw * 40).decode("utf-8", "surrogateescape"),
                                           PATTERNS["gpt2"])
    assert b"caf" in got.pieces and b" \xff\xfe!!" in got.pieces
    assert sum(len(p) * n for p, n in got.pieces.items()) == len(raw) * 40  # every byte kept


def test_utf8_cut_never_splits_a_character():
    text = "aé日🙂".encode()
    for end in range(len(text) + 1):
        head = text[:end]
        cut = utf8_cut(head)
        head[:cut].decode("utf-8")  # whole characters only
        assert cut >= end - 3
    assert align_forward(text, 2) == 3 and align_forward(text, 3) == 3  # é is bytes 1-2


@pytest.mark.parametrize("make,match", [
    (lambda d: d / "missing.txt", "no such file"),
    (lambda d: d, "is a directory"),
])
def test_missing_file_and_directory_are_refused(tmp_path, make, match):
    with pytest.raises(CorpusError, match=match):
        count_pieces([make(tmp_path)], PATTERNS["gpt2"])


def test_a_file_whose_read_fails_is_named():
    # /proc/self/mem is a regular file that cannot be read at offset 0 (even by root)
    if not os.path.isfile("/proc/self/mem"):
        pytest.skip("needs Linux /proc/self/mem for a file whose read fails")
    with pytest.raises(CorpusError, match=r"/proc/self/mem: read failed"):
        count_pieces(["/proc/self/mem"], PATTERNS["gpt2"])


def test_permission_denied_is_named(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("running as root: file permissions do not stop root from reading")
    path = tmp_path / "secret.txt"
    path.write_text("x")
    path.chmod(0)
    with pytest.raises(CorpusError, match="not readable"):
        count_pieces([path], PATTERNS["gpt2"])


def test_bad_pattern_and_mode_are_refused(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("x")
    with pytest.raises(CorpusError, match="not a valid regex"):
        count_pieces([path], "(unclosed")
    with pytest.raises(CorpusError, match="invalid_utf8"):
        count_pieces([path], PATTERNS["gpt2"], invalid_utf8="ignore")
    with pytest.raises(CorpusError, match="no input files"):
        count_pieces([], PATTERNS["gpt2"])


def test_custom_regex_with_groups_and_gaps(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("one, two;three " * 50)
    got = count_pieces([path], r"(\w)+", chunk_bytes=SMALL_CHUNK)  # groups; text between dropped
    assert got.pieces == {b"one": 50, b"two": 50, b"three": 50}
    empty_matches = count_pieces([path], r"\w*", chunk_bytes=SMALL_CHUNK)  # '' is no piece
    assert empty_matches.pieces == got.pieces
