"""tokenizer_svc/corpus_files.py: every input format, compressed or not, read back as the
documents written; origins, bad records, stdin, globs, directories, datasets folders, missing
optional packages, and memory that stays flat on a large compressed corpus."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tokenizer_svc import corpus_files
from tokenizer_svc.corpus_files import CorpusFileError, CorpusReader

pa = pytest.importorskip("pyarrow", reason="the corpora extra (pyarrow) is part of the test "
                                           "extra: pip install -e '.[test]'")
zstandard = pytest.importorskip("zstandard", reason="the corpora extra (zstandard) is part of "
                                                    "the test extra")
import pyarrow.feather  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

DOCS = ["İstanbul'da sabah erkenden vapura bindik.\n", "def f(x):\n    return x\n", "",
        "ünicode 🙂 日本語 \"quoted\" \\ back\\slash", "line one\nline two\r\nthree"]

COMPRESS = {
    "": lambda data: data,
    ".gz": gzip.compress,
    ".zst": lambda data: zstandard.ZstdCompressor().compress(data),
    ".xz": lzma.compress,
    ".bz2": bz2.compress,
}


def read(names, as_bytes=False, **options):
    reader = CorpusReader([str(n) for n in names] if isinstance(names, list) else [str(names)],
                          **options)
    return reader, [(d.data, d.origin) for d in reader.documents(as_bytes=as_bytes)]


def jsonl_bytes(docs, field="text") -> bytes:
    return "".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)).encode()


def write_arrow_stream(path: Path, table) -> None:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=2)


def write_dataset_folder(folder: Path, docs, shards: int = 2) -> None:
    """What `Dataset.save_to_disk(folder, num_shards=shards)` writes: Arrow streams named
    data-0000k-of-0000n.arrow, state.json listing them, dataset_info.json with the features."""
    folder.mkdir(parents=True)
    per = -(-len(docs) // shards)
    names = []
    for k in range(shards):
        name = f"data-{k:05d}-of-{shards:05d}.arrow"
        part = docs[k * per:(k + 1) * per]
        write_arrow_stream(folder / name, pa.table({
            "text": pa.array(part, pa.string()),
            "id": pa.array(range(k * per, k * per + len(part)), pa.int64())}))
        names.append({"filename": name})
    (folder / "state.json").write_text(json.dumps({
        "_data_files": names, "_fingerprint": "0123456789abcdef", "_format_columns": None,
        "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
        "_split": None}, indent=2))
    (folder / "dataset_info.json").write_text(json.dumps({
        "citation": "", "description": "", "homepage": "", "license": "",
        "features": {"text": {"dtype": "string", "_type": "Value"},
                     "id": {"dtype": "int64", "_type": "Value"}}}, indent=2))


# ---- every format, every compression ------------------------------------------------------------

@pytest.mark.parametrize("suffix", list(COMPRESS))
def test_text_jsonl_and_json_read_back_compressed_or_not(tmp_path, suffix):
    squeeze = COMPRESS[suffix]
    (tmp_path / f"a.txt{suffix}").write_bytes(squeeze(DOCS[0].encode()))
    (tmp_path / f"b.jsonl{suffix}").write_bytes(squeeze(jsonl_bytes(DOCS)))
    (tmp_path / f"c.json{suffix}").write_bytes(squeeze(json.dumps(DOCS, indent=2).encode()))
    (tmp_path / f"d.json{suffix}").write_bytes(squeeze(jsonl_bytes(DOCS)))   # to_json's
    reader, docs = read(sorted(tmp_path.iterdir()))
    assert [d for d, _ in docs] == [DOCS[0].encode(), *DOCS, *DOCS, *DOCS]
    assert [i.compression for i in reader.inputs] == [corpus_files.COMPRESSIONS.get(suffix)] * 4
    assert [i.format for i in reader.inputs] == ["text", "jsonl", "json", "json"]
    assert reader.stats.documents == 16 and reader.stats.empty == 3
    assert reader.stats.bytes == sum(len(d.encode()) for d in [DOCS[0], *DOCS * 3])
    origins = [o for _, o in docs]
    assert origins[0] == str(tmp_path / f"a.txt{suffix}")
    assert origins[1:3] == [f"{tmp_path / f'b.jsonl{suffix}'} line {n}" for n in (1, 2)]
    assert origins[6] == f"{tmp_path / f'c.json{suffix}'} element 0 (line 2)"
    assert origins[11] == f"{tmp_path / f'd.json{suffix}'} line 1"
    # as UTF-8 bytes, every one
    _, raw = read(sorted(tmp_path.iterdir()), as_bytes=True)
    assert [d for d, _ in raw] == [DOCS[0].encode()] + [d.encode() for d in DOCS * 3]


def test_parquet_arrow_and_feather_read_the_text_column_only(tmp_path):
    table = pa.table({"id": list(range(len(DOCS))), "content": DOCS,
                      "other": [{"k": 1}] * len(DOCS)})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=2)
    pyarrow.feather.write_feather(table, tmp_path / "b.feather", chunksize=2)
    write_arrow_stream(tmp_path / "c.arrow", table)
    big = pa.table({"content": pa.array(DOCS, pa.large_string())})
    pq.write_table(big, tmp_path / "d.pq")
    binary = pa.table({"content": pa.array([d.encode() for d in DOCS] + [b"\xff raw"],
                                           pa.binary())})
    pyarrow.feather.write_feather(binary, tmp_path / "e.arrow")
    reader, docs = read(sorted(tmp_path.iterdir()), text_field="content")
    assert [d for d, _ in docs] == DOCS * 4 + [d.encode() for d in DOCS] + [b"\xff raw"]
    assert [o for _, o in docs][:3] == [f"{tmp_path / 'a.parquet'} row {n}" for n in range(3)]
    assert docs[-1][1] == f"{tmp_path / 'e.arrow'} row 5"
    assert [i.format for i in reader.inputs] == ["parquet", "arrow", "arrow", "parquet", "arrow"]
    _, raw = read(sorted(tmp_path.iterdir()), as_bytes=True, text_field="content")
    assert [d for d, _ in raw] == [d.encode() for d in DOCS * 5] + [b"\xff raw"]


def test_columns_that_are_missing_or_not_text_are_named(tmp_path):
    pq.write_table(pa.table({"body": ["x"], "n": [1]}), tmp_path / "a.parquet")
    with pytest.raises(CorpusFileError, match=r'a\.parquet: no column "text" \(its columns: '
                                              r'"body", "n"\); name the text\'s column with '
                                              r"--text-field"):
        read(tmp_path / "a.parquet")
    with pytest.raises(CorpusFileError, match=r'column "n" holds int64, not text'):
        read(tmp_path / "a.parquet", text_field="n")
    pq.write_table(pa.table({"text": ["a", None, "c"]}), tmp_path / "b.parquet")
    with pytest.raises(CorpusFileError, match=r'b\.parquet row 1: column "text" is null\. '
                                              r"Fix it, or pass --skip-bad"):
        read(tmp_path / "b.parquet")
    reader, docs = read(tmp_path / "b.parquet", skip_bad=True)
    assert [d for d, _ in docs] == ["a", "c"] and reader.stats.skipped == 1
    (tmp_path / "c.parquet.gz").write_bytes(gzip.compress((tmp_path / "b.parquet").read_bytes()))
    with pytest.raises(CorpusFileError, match=r"gzip-compressed parquet file cannot be read"):
        read(tmp_path / "c.parquet.gz")
    (tmp_path / "d.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(CorpusFileError, match=r"d\.parquet: cannot be read as parquet"):
        read(tmp_path / "d.parquet")


# ---- datasets folders ----------------------------------------------------------------------------

def test_a_datasets_folder_and_a_dataset_dict_are_read_by_their_json(tmp_path):
    docs = [f"document {k}: {DOCS[k % len(DOCS)]}" for k in range(7)]
    write_dataset_folder(tmp_path / "one", docs, shards=3)
    reader, got = read(tmp_path / "one")
    assert [d for d, _ in got] == docs
    assert [i.path.name for i in reader.inputs] == [f"data-0000{k}-of-00003.arrow"
                                                    for k in range(3)]
    assert got[3][1] == f"{tmp_path / 'one' / 'data-00001-of-00003.arrow'} row 0"
    # a DatasetDict: every split, in dataset_dict.json's order (not the folders' names')
    write_dataset_folder(tmp_path / "dict" / "train", docs[:4], shards=1)
    write_dataset_folder(tmp_path / "dict" / "test", docs[4:], shards=1)
    (tmp_path / "dict" / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    _, got = read(tmp_path / "dict")
    assert [d for d, _ in got] == docs
    _, got = read(tmp_path / "dict" / "test")          # one split
    assert [d for d, _ in got] == docs[4:]
    # under a directory: its Arrow files, never its JSON metadata as text
    (tmp_path / "notes.txt").write_text("notes")
    reader, got = read(tmp_path)
    assert [d for d, _ in got] == docs + [b"notes"] + docs     # sorted by path
    assert not any(i.path.suffix == ".json" for i in reader.inputs)
    # a file state.json names that is gone
    (tmp_path / "one" / "data-00001-of-00003.arrow").unlink()
    with pytest.raises(CorpusFileError, match=r"data-00001-of-00003\.arrow, named in "
                                              r"state\.json, is missing"):
        read(tmp_path / "one")


def test_a_folder_saved_by_the_datasets_library(tmp_path):
    datasets = pytest.importorskip(
        "datasets", reason="the `datasets` package is not installed (not a dependency): "
                           "test_a_datasets_folder_and_a_dataset_dict_are_read_by_their_json "
                           "reads the same layout written by hand")
    docs = [f"row {k} {DOCS[k % len(DOCS)]}" for k in range(50)]
    ds = datasets.Dataset.from_dict({"text": docs, "n": list(range(50))})
    ds.save_to_disk(str(tmp_path / "ds"), num_shards=3)
    datasets.DatasetDict({"train": ds, "test": ds.select(range(5))}).save_to_disk(
        str(tmp_path / "dd"))
    assert [d for d, _ in read(tmp_path / "ds")[1]] == docs
    assert [d for d, _ in read(tmp_path / "dd")[1]] == docs + docs[:5]


# ---- bad records --------------------------------------------------------------------------------

BAD_LINES = [
    ('{"body": "x"}', 'no field "text" (its fields: "body"); name the text\'s field with '
                      "--text-field"),
    ('{"text": 42}', 'field "text" is a JSON number, not a string'),
    ('{"text": null}', 'field "text" is a JSON null, not a string'),
    ('["a"]', 'a JSON array; expected a JSON string or an object with a string field "text" '
              "per line"),
    ('{"text": "x"', "not JSON ("),
    ('"\\ud83d alone"', "lone surrogate"),
]


@pytest.mark.parametrize("bad,needle", BAD_LINES)
def test_a_bad_line_is_named_by_file_and_line(tmp_path, bad, needle):
    path = tmp_path / "c.jsonl.gz"
    path.write_bytes(gzip.compress(b'"fine"\n\n{"text": "fine"}\n' + bad.encode() + b"\n\"ok\"\n"))
    with pytest.raises(CorpusFileError) as info:
        read(path)
    message = str(info.value)
    assert message.startswith(f"{path} line 4: ") and needle in message, message
    assert "--skip-bad" in message
    reader, docs = read(path, skip_bad=True)
    assert [d for d, _ in docs] == ["fine", "fine", "ok"]
    assert reader.stats.skipped == 1 and reader.stats.bad_examples[0].startswith(
        f"{path} line 4: ")
    assert "skipped 1 bad record(s)" in reader.stats.describe()


def test_skip_bad_counts_every_bad_record_and_keeps_the_first_few(tmp_path):
    lines = [json.dumps({"text": f"doc {k}"}) if k % 3 else "garbage" for k in range(30)]
    lines[7] = b"\xff\xfe not utf-8".decode("latin-1")
    path = tmp_path / "mixed.jsonl"
    path.write_bytes("\n".join(lines).encode("latin-1"))
    reader, docs = read(path, skip_bad=True)
    assert len(docs) == 19 and reader.stats.skipped == 11
    assert len(reader.stats.bad_examples) == corpus_files.BAD_EXAMPLES
    assert reader.stats.bad_examples[0].startswith(f"{path} line 1: not JSON")
    assert any("line 8: not UTF-8" in e for e in reader.stats.bad_examples)
    # with no --skip-bad option to offer (encode), the message does not suggest one
    with pytest.raises(CorpusFileError) as info:
        read(path, skip_bad=None)
    assert str(info.value).startswith(f"{path} line 1: not JSON") and \
        "--skip-bad" not in str(info.value)


def test_a_json_array_is_read_element_by_element_across_small_reads(tmp_path, monkeypatch):
    values = [DOCS[k % len(DOCS)] * (k % 7) if k % 2 else {"text": DOCS[k % len(DOCS)],
                                                          "n": 1.5e10 + k}
              for k in range(60)]
    expected = [v if isinstance(v, str) else v["text"] for v in values]
    path = tmp_path / "a.json"
    path.write_text(" \n" + json.dumps(values, indent=1) + "\n")
    monkeypatch.setattr(corpus_files, "BUFFER_BYTES", 7)   # elements span many reads
    assert [d for d, _ in read(path)[1]] == expected
    # a syntax error stops the reading, naming the line, whatever --skip-bad says
    text = json.dumps(values[:3], indent=1)
    broken = text[:text.rindex("}")] + "]"          # the last object never closed
    path.write_text(broken)
    with pytest.raises(CorpusFileError, match=r"a\.json line \d+: element 2 is not JSON.*"
                                              r"cannot be skipped"):
        read(path, skip_bad=True)
    path.write_text('["a", "b"')
    with pytest.raises(CorpusFileError, match="the array is not closed"):
        read(path)
    path.write_text('["a" "b"]')
    with pytest.raises(CorpusFileError, match=r"line 1: expected ',' or ']' after element 0"):
        read(path)
    path.write_text('["a", 3, {"text": "b"}]')             # a bad element is skippable
    reader, docs = read(path, skip_bad=True)
    assert [d for d, _ in docs] == ["a", "b"] and reader.stats.skipped == 1
    path.write_text("# not json")
    with pytest.raises(CorpusFileError, match=r"starts with '#'"):
        read(path)


def test_a_damaged_compressed_file_is_named(tmp_path):
    data = gzip.compress(jsonl_bytes(DOCS * 200))
    (tmp_path / "cut.jsonl.gz").write_bytes(data[:len(data) // 2])
    with pytest.raises(CorpusFileError, match=r"cut\.jsonl\.gz: cannot be read as a gzip "
                                              r"stream.*is the file complete"):
        read(tmp_path / "cut.jsonl.gz")
    (tmp_path / "fake.txt.zst").write_bytes(b"plain text, not zstd")
    with pytest.raises(CorpusFileError, match=r"fake\.txt\.zst: cannot be read as a zstd"):
        read(tmp_path / "fake.txt.zst")


# ---- naming inputs: stdin, globs, directories, --format ------------------------------------------

def set_stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_stdin_is_one_text_or_the_format_given_compressed_or_not(monkeypatch):
    set_stdin(monkeypatch, "all of stdin\nis one document".encode())
    assert read("-")[1] == [(b"all of stdin\nis one document", "stdin")]
    set_stdin(monkeypatch, jsonl_bytes(DOCS))
    assert [d for d, _ in read("-", format="jsonl")[1]] == DOCS
    set_stdin(monkeypatch, zstandard.ZstdCompressor().compress(jsonl_bytes(DOCS)))
    reader, docs = read("-", format="jsonl")
    assert [d for d, _ in docs] == DOCS and reader.inputs[0].compression == "zstd"
    set_stdin(monkeypatch, gzip.compress(b"gzipped text"))
    assert read("-")[1] == [(b"gzipped text", "stdin")]
    set_stdin(monkeypatch, b'"a"\n{"text": 5}\n')
    with pytest.raises(CorpusFileError, match=r"^stdin line 2: field \"text\""):
        read("-", format="jsonl")
    with pytest.raises(CorpusFileError, match=r"given twice"):
        CorpusReader(["-", "-"])
    set_stdin(monkeypatch, b"PAR1")
    with pytest.raises(CorpusFileError, match=r"stdin: Parquet cannot be read from a pipe"):
        read("-", format="parquet")


def test_globs_directories_and_include(tmp_path, monkeypatch):
    for rel in ["web/a/1.jsonl", "web/b/2.jsonl.gz", "web/b/3.txt", "web/4.jsonl", "x.jsonl"]:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = jsonl_bytes([rel]) if ".jsonl" in rel else rel.encode()
        path.write_bytes(gzip.compress(data) if rel.endswith(".gz") else data)
    monkeypatch.chdir(tmp_path)
    _, docs = read("web/**/*.jsonl*")              # expanded by us, ** spans folders
    assert [d for d, _ in docs] == ["web/4.jsonl", "web/a/1.jsonl", "web/b/2.jsonl.gz"]
    _, docs = read("web")                          # a directory: recursive, sorted by path
    assert [d for d, _ in docs] == ["web/4.jsonl", "web/a/1.jsonl", "web/b/2.jsonl.gz",
                                    b"web/b/3.txt"]
    _, docs = read("web", include=["*.txt", "1.*"])
    assert [d for d, _ in docs] == ["web/a/1.jsonl", b"web/b/3.txt"]
    reader, docs = read(["x.jsonl", "web/b"], format="text")   # every file as one text
    assert [d for d, _ in docs] == [jsonl_bytes(["x.jsonl"]), gzip.decompress(
        gzip.compress(jsonl_bytes(["web/b/2.jsonl.gz"]))), b"web/b/3.txt"]
    with pytest.raises(CorpusFileError, match=r"web/\*\.parquet: no file matches"):
        CorpusReader(["web/*.parquet"])
    with pytest.raises(CorpusFileError, match=r"nope\.txt: no such file or directory"):
        CorpusReader(["x.jsonl", "nope.txt"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusFileError, match=r"empty: no files in this directory"):
        CorpusReader(["empty"])
    with pytest.raises(CorpusFileError, match=r"no files in this directory match --include"):
        CorpusReader(["web"], include=["*.py"])


def test_a_missing_optional_package_names_the_extra(tmp_path, monkeypatch):
    pq.write_table(pa.table({"text": ["x"]}), tmp_path / "a.parquet")
    (tmp_path / "b.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(b"x"))
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(CorpusFileError, match=r"a\.parquet: reading parquet needs the pyarrow "
                                              r"package: pip install 'istanbul\[corpora\]'"):
        CorpusReader([tmp_path / "a.parquet"])
    if sys.version_info < (3, 14):
        monkeypatch.setitem(sys.modules, "zstandard", None)
        with pytest.raises(CorpusFileError, match=r"b\.txt\.zst: reading zstd needs the "
                                                  r"zstandard package: pip install "
                                                  r"'istanbul\[corpora\]'"):
            CorpusReader([tmp_path / "b.txt.zst"])


# ---- memory stays flat ---------------------------------------------------------------------------

MEASURE = textwrap.dedent("""
    import json, resource, sys
    import pyarrow, pyarrow.parquet, pyarrow.ipc, zstandard
    from tokenizer_svc.corpus_files import CorpusReader
    def peak_mb():
        # VmHWM: this process's own peak (ru_maxrss keeps the parent's across exec on Linux)
        try:
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
        except OSError:
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    before = peak_mb()
    reader = CorpusReader([sys.argv[1]], text_field="text")
    longest = 0
    for doc in reader.documents(as_bytes=True):
        longest = max(longest, len(doc.data))
    print(json.dumps({"before_mb": before, "after_mb": peak_mb(), "longest": longest,
                      "documents": reader.stats.documents, "bytes": reader.stats.bytes}))
""")


def _peak_growth(path: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", MEASURE, str(path)], capture_output=True,
                          text=True, check=True, cwd=Path(__file__).resolve().parent.parent)
    return json.loads(done.stdout)


def _documents(total_bytes: int):
    """Varied documents (100 B - 64 KB) of this repository's sources, `total_bytes` of them."""
    root = Path(__file__).resolve().parent.parent
    source = "".join(p.read_text(encoding="utf-8") for p in sorted(
        (root / "tokenizer_svc").glob("*.py")))
    made = k = 0
    while made < total_bytes:
        start = (k * 7919) % (len(source) - 70000)
        doc = source[start:start + 100 + (k * 4099) % 65000]
        made += len(doc.encode())
        k += 1
        yield doc


def test_memory_stays_flat_on_a_large_compressed_jsonl(tmp_path):
    """200 MB of JSON Lines, generated into a .zst as it is written, read through the reader in
    a fresh process: its peak RSS grows by a few MB (read buffers, one line), not by the
    corpus (the whole file in memory would add 200 MB)."""
    path = tmp_path / "big.jsonl.zst"
    with open(path, "wb") as fh, zstandard.ZstdCompressor(level=1).stream_writer(fh) as out:
        for k, doc in enumerate(_documents(200 << 20)):
            out.write((json.dumps({"id": k, "text": doc}) + "\n").encode())
    got = _peak_growth(path)
    growth = got["after_mb"] - got["before_mb"]
    print(f"\n200 MB JSONL.zst: {got['documents']:,} documents, {got['bytes'] / 1e6:.0f} MB; "
          f"peak RSS {got['before_mb']:.0f} -> {got['after_mb']:.0f} MB (+{growth:.1f})")
    assert got["bytes"] >= 200 << 20
    assert growth < 32, got


def test_memory_stays_flat_on_a_large_parquet_row_group(tmp_path):
    """A Parquet file of one 128 MB row group: its pages are read through a 1 MiB buffer and
    its rows go out in batches, so the peak grows by well under the row group. (A page is
    decompressed whole: written with pages of about 1 MB, as most writers make them; pyarrow
    checks the page size every `write_batch_size` values, 1024 by default, so 1024 documents
    of 32 KB would make 32 MB pages.)"""
    docs = list(_documents(128 << 20))
    pq.write_table(pa.table({"id": list(range(len(docs))), "text": docs}),
                   tmp_path / "big.parquet", row_group_size=len(docs), compression="zstd",
                   write_batch_size=64, data_page_size=1 << 20)
    del docs
    got = _peak_growth(tmp_path / "big.parquet")
    growth = got["after_mb"] - got["before_mb"]
    print(f"\n128 MB Parquet row group: {got['documents']:,} documents; peak RSS "
          f"{got['before_mb']:.0f} -> {got['after_mb']:.0f} MB (+{growth:.1f})")
    assert got["bytes"] >= 128 << 20
    assert growth < 48, got
