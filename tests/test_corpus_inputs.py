"""The corpus readers (tokenizer_svc/corpus_files.py) behind `istanbul prepare`, `istanbul
vocab train` and `istanbul encode FILES`: the same documents given as JSON Lines, JSON,
Parquet, a datasets folder, compressed or on stdin, give what they give as text files (ids
checked against tiktoken, pieces and vocabularies against the text-file path)."""

from __future__ import annotations

import gzip
import io
import json
import lzma
import sys
from pathlib import Path

import numpy as np
import pytest

from istanbul.cli import main
from tokenizer_svc.corpus_files import CorpusReader
from tokenizer_svc.patterns import PATTERNS
from tokenizer_svc.training.corpus import CorpusError, count_pieces
from tokenizer_svc.training.gpu_corpus import count_pieces_gpu
from trainer_svc.data.files import shard_paths
from trainer_svc.data.shards import decode_shard

from .service_support import write_tiny_vocabulary
from .test_corpus_files import jsonl_bytes, write_dataset_folder
from .test_prepare import SAMPLES, reference_ids

pa = pytest.importorskip("pyarrow", reason="the corpora extra (pyarrow) is part of the test "
                                           "extra: pip install -e '.[test]'")
zstandard = pytest.importorskip("zstandard", reason="the corpora extra (zstandard) is part of "
                                                    "the test extra")
import pyarrow.parquet as pq  # noqa: E402

EOT = "<|endoftext|>"
STDLIB = Path(json.__file__).parent.parent
CORPUS = [(STDLIB / name).read_text(encoding="utf-8")
          for name in ("textwrap.py", "shlex.py", "json/decoder.py")]
DOCS = [*CORPUS, *SAMPLES, "short", "x" * 9000 + " ünïcode " + EOT + " after", ""]


def as_text_files(folder: Path, docs) -> list[Path]:
    folder.mkdir()
    files = []
    for k, doc in enumerate(docs):
        files.append(folder / f"{k:03d}.txt")
        files[-1].write_text(doc, encoding="utf-8")
    return files


def as_formats(folder: Path, docs) -> list[Path]:
    """The documents spread over a .jsonl.zst, a .parquet, a .json.gz array and a datasets
    folder, in this order."""
    folder.mkdir()
    quarter = -(-len(docs) // 4)
    parts = [docs[k * quarter:(k + 1) * quarter] for k in range(4)]
    paths = [folder / "a.jsonl.zst", folder / "b.parquet", folder / "c.json.gz", folder / "d"]
    paths[0].write_bytes(zstandard.ZstdCompressor().compress(jsonl_bytes(parts[0])))
    pq.write_table(pa.table({"text": parts[1]}), paths[1], row_group_size=2)
    paths[2].write_bytes(gzip.compress(json.dumps(parts[2]).encode()))
    write_dataset_folder(paths[3], parts[3], shards=2)
    return paths


# ---- vocab train: the pieces and the vocabulary of records equal those of text files -----------

@pytest.mark.parametrize("workers", [1, 2])
def test_records_count_the_pieces_text_files_count(tmp_path, workers):
    files = as_text_files(tmp_path / "txt", DOCS)
    want = count_pieces(files, PATTERNS["o200k"], (EOT,), workers=1)
    got = count_pieces(CorpusReader([str(p) for p in as_formats(tmp_path / "fmt", DOCS)]),
                       PATTERNS["o200k"], (EOT,), workers=workers, chunk_bytes=4096)
    assert got.pieces == want.pieces
    assert (got.occurrences, got.specials_seen, got.bytes_read, got.documents) == \
        (want.occurrences, want.specials_seen, want.bytes_read, len(DOCS))
    assert got.files == 5 and "document(s) in 5 file(s)" in got.describe()


def test_compressed_text_and_stdin_are_one_text_each(tmp_path, monkeypatch):
    files = as_text_files(tmp_path / "txt", CORPUS)
    want = count_pieces(files, PATTERNS["gpt2"], workers=1)
    (tmp_path / "a.py.gz").write_bytes(gzip.compress(CORPUS[0].encode()))
    (tmp_path / "b.py.zst").write_bytes(zstandard.ZstdCompressor().compress(CORPUS[1].encode()))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(CORPUS[2].encode())))
    reader = CorpusReader([str(tmp_path / "a.py.gz"), str(tmp_path / "b.py.zst"), "-"])
    got = count_pieces(reader, PATTERNS["gpt2"], workers=1, chunk_bytes=1024)  # many chunks
    assert (got.pieces, got.occurrences, got.bytes_read) == \
        (want.pieces, want.occurrences, want.bytes_read)


def test_the_gpu_counter_takes_records_small_and_large(device, tmp_path):
    """Small records gathered into device calls, records over a quarter chunk cut into
    chunks, a compressed text streamed: the CPU path's pieces on text files exactly."""
    files = as_text_files(tmp_path / "txt", DOCS)
    want = count_pieces(files, PATTERNS["cl100k"], (EOT,), workers=1)
    inputs = [str(p) for p in as_formats(tmp_path / "fmt", DOCS)]
    got = count_pieces_gpu(CorpusReader(inputs), "cl100k", (EOT,), device=device,
                           chunk_bytes=4096)
    assert got.pieces == want.pieces
    assert (got.occurrences, got.specials_seen, got.bytes_read, got.documents) == \
        (want.occurrences, want.specials_seen, want.bytes_read, len(DOCS))
    (tmp_path / "whole.txt.xz").write_bytes(lzma.compress("".join(DOCS).encode()))
    streamed = count_pieces_gpu(CorpusReader([str(tmp_path / "whole.txt.xz")]), "cl100k",
                                (EOT,), device=device, chunk_bytes=4096)
    whole = tmp_path / "whole.txt"
    whole.write_text("".join(DOCS), encoding="utf-8")
    assert streamed.pieces == count_pieces([whole], PATTERNS["cl100k"], (EOT,),
                                           workers=1).pieces


def test_a_record_that_is_not_utf8_is_named_or_kept(device, tmp_path):
    table = pa.table({"text": pa.array([b"fine text here", b"bad \xff byte" * 40, b"ok"],
                                       pa.binary())})
    pq.write_table(table, tmp_path / "raw.parquet")
    for count in (lambda r, **kw: count_pieces(r, PATTERNS["gpt2"], workers=1, **kw),
                  lambda r, **kw: count_pieces_gpu(r, "gpt2", device=device, **kw)):
        with pytest.raises(CorpusError, match=r"raw\.parquet row 1: invalid UTF-8 at byte 4"):
            count(CorpusReader([str(tmp_path / "raw.parquet")]))
    kept_cpu = count_pieces(CorpusReader([str(tmp_path / "raw.parquet")]), PATTERNS["gpt2"],
                            invalid_utf8="keep", workers=1)
    kept_gpu = count_pieces_gpu(CorpusReader([str(tmp_path / "raw.parquet")]), "gpt2",
                                invalid_utf8="keep", device=device)
    assert kept_gpu.pieces == kept_cpu.pieces and b" \xff" in kept_cpu.pieces
    assert kept_gpu.fallback_chunks == 1


def test_vocab_train_on_jsonl_writes_the_vocabulary_of_the_text_files(tmp_path, capsys,
                                                                      monkeypatch):
    files = as_text_files(tmp_path / "txt", DOCS)
    base = ["--size", "400", "--special", EOT, "--trainer", "cpu", "--workers", "1",
            "--no-progress"]
    assert main(["vocab", "train", *map(str, files), "-o", str(tmp_path / "t.tiktoken"),
                 *base]) == 0
    (tmp_path / "docs.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(DOCS, "content")
                                                           + b"not json\n"))
    capsys.readouterr()
    assert main(["vocab", "train", str(tmp_path / "docs.jsonl.gz"), "-o",
                 str(tmp_path / "j.tiktoken"), "--text-field", "content", *base]) == 1
    err = capsys.readouterr().err
    assert f"docs.jsonl.gz line {len(DOCS) + 1}: not JSON" in err and "--skip-bad" in err
    assert "no output written" in err and not (tmp_path / "j.tiktoken").exists()
    assert main(["vocab", "train", str(tmp_path / "docs.jsonl.gz"), "-o",
                 str(tmp_path / "j.tiktoken"), "--text-field", "content", "--skip-bad",
                 *base]) == 0
    out = capsys.readouterr().out
    assert f"{len(DOCS)} document(s) in 1 file(s)" in out and "1 bad record(s) skipped" in out
    assert (tmp_path / "j.tiktoken").read_bytes() == (tmp_path / "t.tiktoken").read_bytes()
    # from stdin, and a directory holding the text files
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(jsonl_bytes(DOCS))))
    assert main(["vocab", "train", "-", "--format", "jsonl", "-o",
                 str(tmp_path / "s.tiktoken"), *base]) == 0
    assert (tmp_path / "s.tiktoken").read_bytes() == (tmp_path / "t.tiktoken").read_bytes()
    assert main(["vocab", "train", str(tmp_path / "txt"), "-o", str(tmp_path / "d.tiktoken"),
                 *base]) == 0
    assert (tmp_path / "d.tiktoken").read_bytes() == (tmp_path / "t.tiktoken").read_bytes()


# ---- prepare: the shards of records equal those of text files -----------------------------------

def shard_ids(out: Path, vocab_path: Path) -> list[int]:
    from tokenizer_svc.vocab import load_vocabulary
    v = load_vocabulary(str(vocab_path))
    return np.concatenate([decode_shard(p.read_bytes(), n_vocab=v.n_vocab,
                                        vocab_hash=v.content_hash)
                           for p in shard_paths(str(out))]).tolist()


def test_prepare_reads_every_format_into_the_ids_of_the_documents(tmp_path, capsys,
                                                                  monkeypatch):
    (tmp_path / "vocab").mkdir()
    vocab = write_tiny_vocabulary(tmp_path / "vocab")
    from tokenizer_svc.vocab import load_vocabulary
    eot = load_vocabulary(str(vocab)).eot_token
    expected = []
    for doc in DOCS:
        if doc:
            expected += [eot] + reference_ids(vocab, doc)
    inputs = [str(p) for p in as_formats(tmp_path / "fmt", DOCS)]
    out = tmp_path / "shards"
    assert main(["prepare", *inputs, "--vocab", str(vocab), "--out", str(out),
                 "--shard-tokens", "500", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert shard_ids(out, vocab) == expected
    text_bytes = sum(len(d.encode()) for d in DOCS)
    assert f"{len(DOCS) - 2} documents, {text_bytes / 1e6:,.1f} MB of text in from 5 " \
           f"input(s), {len(expected):,} tokens out, in " in printed
    assert "MB/s)" in printed and "skipped 2 empty document(s)" in printed
    # a glob (quoted: expanded by prepare) and stdin
    monkeypatch.chdir(tmp_path / "fmt")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(
        zstandard.ZstdCompressor().compress(jsonl_bytes(DOCS)))))
    assert main(["prepare", "-", "--format", "jsonl", "--vocab", str(vocab), "--out",
                 str(tmp_path / "stdin"), "--no-progress"]) == 0
    assert shard_ids(tmp_path / "stdin", vocab) == expected
    assert main(["prepare", "*.parquet", "--vocab", str(vocab), "--out",
                 str(tmp_path / "glob"), "--no-progress"]) == 0
    assert "from 1 input(s)" in capsys.readouterr().out


def test_prepare_stops_at_a_bad_record_or_skips_it(tmp_path, capsys):
    (tmp_path / "vocab").mkdir()
    vocab = write_tiny_vocabulary(tmp_path / "vocab")
    path = tmp_path / "docs.jsonl"
    path.write_bytes(jsonl_bytes(DOCS[:3]) + b'{"text": null}\n' + jsonl_bytes(DOCS[3:5]))
    out = tmp_path / "shards"
    base = ["--vocab", str(vocab), "--out", str(out), "--shard-tokens", "100",
            "--no-progress"]
    assert main(["prepare", str(path), *base]) == 1
    err = capsys.readouterr().err
    assert f"{path} line 4: field \"text\" is a JSON null, not a string" in err
    assert "--skip-bad" in err
    assert not list(out.glob("shard_*")), "the writer is aborted: no shards left behind"
    assert main(["prepare", str(path), "--skip-bad", *base]) == 0
    printed = capsys.readouterr().out
    assert "skipped 1 bad record(s) (--skip-bad); the first: " in printed
    assert f"{path} line 4" in printed and "5 documents" in printed
    assert main(["prepare", str(tmp_path / "docs.parquet"), *base, "--replace"]) == 1
    assert "docs.parquet: no such file or directory" in capsys.readouterr().err


# ---- encode FILES -------------------------------------------------------------------------------

def test_encode_files_prints_one_array_per_document(tmp_path, capsys, monkeypatch):
    from .tokenizer_support import tiktoken_twin, trained_vocab_path, vocabulary_for
    path = str(trained_vocab_path("cl100k"))
    tik = tiktoken_twin(vocabulary_for("trained-cl100k"))
    docs = DOCS[3:9]
    inputs = [str(p) for p in as_formats(tmp_path / "fmt", docs)]
    (tmp_path / "plain.txt").write_text(docs[0], encoding="utf-8")
    (tmp_path / "raw.bin").write_bytes(b"not utf-8 \xff\xfe")
    assert main(["encode", "--vocab", path, "--cpu", *inputs, str(tmp_path / "plain.txt"),
                 str(tmp_path / "raw.bin"), "--special", "text"]) == 0
    arrays = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert arrays == [tik.encode(d, disallowed_special=()) for d in docs + [docs[0]]] + [
        tik._encode_bytes(b"not utf-8 \xff\xfe")]
    # a text field by name, a bad record named
    (tmp_path / "c.jsonl").write_bytes(jsonl_bytes(["a", "b"], "body") + b'{"x": 1}\n')
    assert main(["encode", "--vocab", path, "--cpu", str(tmp_path / "c.jsonl"),
                 "--text-field", "body"]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'c.jsonl'} line 3: the object has no field \"body\"" in err
    assert "--skip-bad" not in err          # encode has no such option: one array per record


def test_the_shard_file_writer_takes_uint32_and_other_ids_alike(tmp_path):
    """prepare hands the encoder's uint32 ids over without a copy; lists and int64 arrays (a
    service's) are checked and packed the same; ids outside the vocabulary are refused."""
    from trainer_svc.data.files import DataFilesError, ShardFileWriter
    docs = [np.array([5, 7, 9], np.uint32), [1, 2], np.array([299], np.int64), []]
    writer = ShardFileWriter(tmp_path / "w", vocab_hash="ab" * 32, n_vocab=300, eot_id=0,
                             shard_tokens=4)
    for ids in docs:
        writer.add_document(ids)
    meta = writer.close()
    got = np.concatenate([decode_shard(p.read_bytes(), n_vocab=300, vocab_hash="ab" * 32)
                          for p in shard_paths(str(tmp_path / "w"))]).tolist()
    assert got == [0, 5, 7, 9, 0, 1, 2, 0, 299, 0] and meta["documents"] == 4
    bad = ShardFileWriter(tmp_path / "b", vocab_hash="ab" * 32, n_vocab=300, eot_id=0)
    for ids in (np.array([300], np.uint32), [-1], np.array([3, 400])):
        with pytest.raises(DataFilesError, match=r"document 0: ids outside the vocabulary"):
            bad.add_document(ids)
