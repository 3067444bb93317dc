"""GPU pre-tokenization + piece counting (training/gpu_corpus.py) equals the CPU path exactly.

The CPU path (training/corpus.py, itself checked against a whole-text regex scan in
test_vocab_train_corpus.py) is the reference: same unique pieces, same counts, same totals,
on every pattern the GPU pre-tokenizes, with special tokens, many chunks, long pieces,
invalid UTF-8 and stretches that have no provable piece boundary.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from istanbul.shaders.kernels.bpe_train import trainer as gpu_trainer
from istanbul.shaders.kernels.bpe_train.piece_count import GpuPieceCounter
from istanbul.shaders.kernels.bpe_train.piece_store import LONG_MIN
from tokenizer_svc.patterns import PATTERNS
from tokenizer_svc.training import TrainingError, cpu_reference, train_vocabulary
from tokenizer_svc.training.corpus import CorpusError, count_pieces
from tokenizer_svc.training.gpu_corpus import count_pieces_gpu, gpu_pattern

EOT = "<|endoftext|>"
MIXED = ("Hello world's  fine   \r\n\r\n  tabs\t\there 12345678 digits ünïcödé 日本語テキスト "
         "Привет мир, γειά σου κόσμε! مرحبا بالعالم שלום עולם नमस्ते दुनिया 안녕하세요 "
         "HELLOworld WORLD's naïve I'M don't we'll they've 🙂🙃 emoji\u200b zero width\n"
         "x" + "=" * 40 + " /path/to\n/file  \n\n\n   end   " + EOT + "after" + EOT + EOT)
LONG = ("a" * (LONG_MIN + 300) + " " + "7" * 900 + " " * (LONG_MIN + 50) + "b"
        + "\n" * 600 + "é" * 700 + " ok")


def same(cpu, gpu):
    assert gpu.pieces == cpu.pieces
    assert (gpu.occurrences, gpu.specials_seen, gpu.bytes_read, gpu.files) == \
        (cpu.occurrences, cpu.specials_seen, cpu.bytes_read, cpu.files)


@pytest.mark.parametrize("pattern", ["gpt2", "cl100k", "o200k"])
@pytest.mark.parametrize("specials", [(), (EOT,)])
def test_many_chunks_and_files_equal_the_cpu_path(device, tmp_path, pattern, specials):
    files = []
    for i, text in enumerate([MIXED * 40, "", LONG + MIXED, MIXED[:37]]):
        files.append(tmp_path / f"f{i}.txt")
        files[-1].write_text(text, encoding="utf-8")
    cpu = count_pieces(files, PATTERNS[pattern], specials, workers=1)
    gpu = count_pieces_gpu(files, pattern, specials, device=device, chunk_bytes=4096)
    same(cpu, gpu)
    assert gpu.fallback_chunks == 0
    assert any(len(p) > LONG_MIN for p in gpu.pieces)  # host-counted long pieces are in there


def test_the_device_store_grows_across_chunks_and_stays_exact(device, tmp_path):
    # a store of 8 records to start with: its records, bytes and table grow (the table is
    # rehashed on the device) while later chunks add to counts of pieces stored earlier
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"{MIXED} w{i % 97} n{i * 7919 % 1009} " for i in range(300)),
                    encoding="utf-8")
    cpu = count_pieces([path], PATTERNS["o200k"], (EOT,), workers=1)
    gpu = count_pieces_gpu([path], "o200k", (EOT,), device=device, chunk_bytes=4096,
                           first_store_records=8)
    same(cpu, gpu)
    assert gpu.details["store_growths"] >= 4
    assert gpu.details["device_calls_made"] >= 10


def test_many_small_files_share_device_calls_and_equal_the_cpu_path(device, tmp_path):
    files = []
    for i in range(40):
        files.append(tmp_path / f"small{i:02d}.txt")
        files[-1].write_bytes((MIXED[i:] * (i % 4) + f" file {i}\n").encode()
                              + (b"bad \xff byte" if i == 17 else b""))
    cpu = count_pieces(files, PATTERNS["gpt2"], (EOT,), invalid_utf8="keep", workers=1)
    gpu = count_pieces_gpu(files, "gpt2", (EOT,), invalid_utf8="keep", device=device,
                           chunk_bytes=4096)
    same(cpu, gpu)
    assert gpu.fallback_chunks == 1  # the file with the invalid byte
    with pytest.raises(CorpusError, match="small17.txt: invalid UTF-8 at byte"):
        count_pieces_gpu(files, "gpt2", device=device, chunk_bytes=4096)


texts = st.lists(st.sampled_from(list("ab AB'\n\r\t1é日🙂.,-_/ ") +
                                 ["ll", "'re", "  ", "\r\n", "a" * 80, " " * 90, "7" * 50, EOT,
                                  "<|endo"]),
                 max_size=150).map("".join)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts, pattern=st.sampled_from(["gpt2", "cl100k", "o200k"]))
def test_random_texts_equal_the_cpu_path(device, tmp_path, text, pattern):
    path = tmp_path / "random.txt"
    path.write_text(text * 30, encoding="utf-8")
    cpu = count_pieces([path], PATTERNS[pattern], (EOT,), workers=1)
    same(cpu, count_pieces_gpu([path], pattern, (EOT,), device=device, chunk_bytes=4096))


def test_invalid_utf8_errors_alike_and_kept_bytes_equal_the_cpu_path(device, tmp_path):
    path = tmp_path / "bad.bin"
    path.write_bytes(MIXED.encode() * 20 + b"ok \xff\xfe bad \xc3( " + MIXED.encode())
    with pytest.raises(CorpusError) as cpu_error:
        count_pieces([path], PATTERNS["o200k"], workers=1)
    with pytest.raises(CorpusError) as gpu_error:
        count_pieces_gpu([path], "o200k", device=device, chunk_bytes=4096)
    assert str(gpu_error.value) == str(cpu_error.value)
    assert "--invalid-utf8 keep" in str(gpu_error.value)
    cpu = count_pieces([path], PATTERNS["o200k"], invalid_utf8="keep", workers=1)
    gpu = count_pieces_gpu([path], "o200k", invalid_utf8="keep", device=device, chunk_bytes=4096)
    same(cpu, gpu)
    assert gpu.fallback_chunks == 1 and b"\xff\xfe" in b"".join(gpu.pieces)


@pytest.mark.parametrize("pattern,before", [("cl100k", ""), ("o200k", MIXED * 30)])
def test_no_provable_boundary_within_a_device_call_goes_the_cpu_path(device, tmp_path,
                                                                     pattern, before):
    # at the file's start, or after chunks the GPU counted (the CPU continues from there)
    path = tmp_path / "spaces.txt"
    path.write_text(before + "x" + " " * 20_000 + "y z\n" + MIXED * 3 + EOT + "q",
                    encoding="utf-8")
    cpu = count_pieces([path], PATTERNS[pattern], (EOT,), workers=1)
    gpu = count_pieces_gpu([path], pattern, (EOT,), device=device, chunk_bytes=4096,
                           max_chunk_bytes=8192)
    same(cpu, gpu)
    assert gpu.fallback_chunks == 1


def test_a_full_hash_table_grows_and_stays_exact(device):
    data = MIXED.encode() * 3
    want = Counter()
    for p in count_pieces_text(data):
        want[p] += 1
    counter = GpuPieceCounter(device, "o200k", first_slots=16)
    got: Counter = Counter()
    counter.count(data, np.array([0, len(data)], np.int64), got)
    assert counter.table_growths >= 2
    got.update(counter.store.pieces())  # the device store holds all but the long pieces
    assert got == want


def count_pieces_text(data: bytes) -> list:
    import regex
    return [m.encode() for m in regex.findall(PATTERNS["o200k"], data.decode()) if m]


def test_training_with_gpu_pieces_equals_cpu_pieces(device, tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(MIXED * 30 + LONG, encoding="utf-8")
    common = dict(size=400, pattern="cl100k", specials=[EOT], device=device, workers=1)
    on_gpu, report = train_vocabulary([path], pretokenizer="gpu", **common)
    on_cpu, _ = train_vocabulary([path], pretokenizer="cpu", trainer="cpu", **common)
    assert report.details["pretokenizer"] == "gpu"
    assert on_gpu.ranks == on_cpu.ranks and on_gpu.special_tokens == on_cpu.special_tokens


def test_the_gpu_trainer_takes_counted_pieces_without_a_dict(device, tmp_path):
    # stored pieces, host-counted long pieces and a file on the CPU path (kept invalid
    # UTF-8) whose pieces are also in the store: the trainer's arrays hold those twice, with
    # their two counts, and must learn the CPU reference's merges from them
    files = [tmp_path / "a.txt", tmp_path / "bad.bin"]
    files[0].write_text(MIXED * 30 + LONG, encoding="utf-8")
    files[1].write_bytes(MIXED.encode() * 10 + b"ok \xff\xfe bad " + MIXED.encode())
    # small files (a quarter chunk at most): the valid one goes to the store, the other to
    # the CPU path
    gpu = count_pieces_gpu(files, "o200k", invalid_utf8="keep", device=device,
                           chunk_bytes=1 << 20)
    cpu = count_pieces(files, PATTERNS["o200k"], invalid_utf8="keep", workers=1)
    assert gpu.fallback_chunks == 1
    pieces = gpu.pieces
    assert pieces.has_pair() and gpu.occurrences == cpu.occurrences
    flat, lens, counts = pieces.trainer_arrays()
    assert lens.size > sum(1 for p in cpu.pieces if len(p) >= 2)  # the CPU file's come twice
    assert int(lens.sum()) == flat.size
    got = gpu_trainer.train(pieces, 560, device=device)
    assert pieces._dict is None  # training built no dict of the pieces
    want = cpu_reference.train(cpu.pieces, 560)
    assert got.merges == want.merges
    assert len(pieces) == len(cpu.pieces) and pieces == cpu.pieces


def test_patterns_without_a_gpu_pretokenizer_are_refused_clearly(device, tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(MIXED, encoding="utf-8")
    assert gpu_pattern("r50k") == "gpt2" and gpu_pattern(PATTERNS["o200k"]) == "o200k"
    assert gpu_pattern(r"\w+|\s+") is None
    with pytest.raises(TrainingError, match="--pretokenizer cpu"):
        train_vocabulary([path], 300, pattern=r"\w+|\s+", pretokenizer="gpu", device=device)
    with pytest.raises(CorpusError, match="no GPU pre-tokenizer"):
        count_pieces_gpu([path], r"\w+|\s+", device=device)


def test_cli_gpu_pretokenizer_writes_the_cpu_pipelines_file(device, tmp_path, capsys):
    from istanbul.cli import main
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(MIXED * 20, encoding="utf-8")
    outs = {}
    for where in ("gpu", "cpu"):
        outs[where] = tmp_path / f"{where}.tiktoken"
        assert main(["vocab", "train", str(corpus), "--size", "320", "--pattern", "o200k",
                     "--special", EOT, "--pretokenizer", where, "--trainer", where,
                     "--workers", "1", "--no-progress", "-o", str(outs[where])]) == 0
    assert "pre-tokenized in" in capsys.readouterr().out
    assert outs["gpu"].read_bytes() == outs["cpu"].read_bytes()


@pytest.mark.parametrize("pattern", ["gpt2", "o200k"])
def test_code_points_newer_than_tiktokens_tables_split_alike(device, tmp_path, pattern):
    # `regex` (newer Unicode) calls e.g. Kirat Rai (U+16D40.., Unicode 16) letters, tiktoken's
    # tables do not: on the H200's 100 MB corpus the CPU path split ' "𖻃",' apart and the GPU
    # kept it whole. Both now use tiktoken's classes: every code point where the two tables
    # disagree, in context, gives the same pieces (and the CPU ones are tiktoken's split).
    import regex
    from istanbul.shaders.kernels.bpe.unicode_table import all_code_points_text, load_table
    table, text = load_table("tiktoken"), all_code_points_text()
    odd = []
    for key, prop in (("L", r"\p{L}"), ("N", r"\p{N}"), ("S", r"\s")):
        theirs = {ord(c) for c in regex.findall(prop, text)}
        mine = set(np.flatnonzero(table.members(key)).tolist())
        odd += sorted(theirs ^ mine)
    assert 0x16EC3 in odd                     # the corpus' example
    chars = [chr(c) for c in odd if not 0xD800 <= c < 0xE000]
    doc = "".join(f' "{c}",\n x{c}y {c}{c}7 ' for c in chars)
    path = tmp_path / "newer.txt"
    path.write_text(doc, encoding="utf-8")
    cpu = count_pieces([path], PATTERNS[pattern], (), workers=1)
    same(cpu, count_pieces_gpu([path], pattern, (), device=device, chunk_bytes=1 << 16))
    if pattern == "o200k":                  # the H200 corpus' piece, whole as on the GPU
        assert ' "\U00016ec3",\n'.encode() in cpu.pieces


def test_too_many_unique_pieces_for_the_device_fail_clearly(device, tmp_path):
    # the store's buffers scaled down to 4 KiB: ~300 distinct pieces cannot fit
    path = tmp_path / "varied.txt"
    path.write_text(" ".join(f"w{i}" for i in range(3000)), encoding="utf-8")
    with pytest.raises(CorpusError, match=r"more unique pieces than this device can count"
                       r".*needed.*MiB.*--pretokenizer cpu"):
        count_pieces_gpu([path], "o200k", device=device, first_store_records=8,
                         buffer_limit=4096)
