"""GPU encoding is exactly tiktoken's: real wgpu device (lavapipe in CI), real vocabularies
(../shared/vocab, skipped when absent) and vocabularies trained here (always)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from istanbul.shaders.kernels.bpe.encode import (MAX_LANE_SHIFT, NONE, SMALL_CHUNK,
                                                 SPREAD_INVOCATIONS, TINY_CALL_BYTES, TINY_CHUNK,
                                                 GpuEncoder)
from istanbul.shaders.kernels.bpe.packed_text import PackedText
from tokenizer_svc.encoding import Encoding, get_encoding
from tokenizer_svc.reference import fix_surrogates
from istanbul.shaders.kernels.bpe.unicode_table import all_code_points_text

from .tokenizer_support import (MULTILINGUAL, SHARED, TRAINED, TRICKY, corpus_docs, long_runs,
                                megabyte_document, tiktoken_twin, vocabulary_for)

VOCABS = SHARED + TRAINED
TRICKY_CHARS = list("'sSſlLvVrReEdDmMtT \t\r\n0123456789/!?.ʕªǅ\u0301\u00a0\u3000日üß") + \
    ["\u200d", "👍", "\U0001F3FD", "\u2028", "\x85"]
CHARS = st.one_of(st.characters(), st.sampled_from(TRICKY_CHARS))
DOCS = st.lists(st.text(alphabet=CHARS, max_size=48), min_size=1, max_size=8)
HYPO = settings(max_examples=20, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module", params=VOCABS)
def pair(request, device):
    vocab = vocabulary_for(request.param)
    return get_encoding(vocab, device=device), tiktoken_twin(vocab)


def test_gpu_runs_the_pre_tokenizer_where_it_can(pair):
    enc, _ = pair
    assert isinstance(enc, Encoding) and enc.backend.kind == "gpu"
    assert enc.backend.on_gpu_pretok == (enc.vocab.pattern_name is not None)


def test_tricky_multilingual_and_corpus(pair):
    enc, tik = pair
    docs = TRICKY + MULTILINGUAL + corpus_docs()
    assert enc.encode_ordinary_batch(docs) == tik.encode_ordinary_batch(docs)


def test_runs_of_ten_thousand(pair):
    enc, tik = pair
    docs = long_runs(10_000)
    got = enc.encode_ordinary_batch(docs)
    for doc, ids in zip(docs, got):
        assert ids == tik.encode_ordinary(doc), repr(doc[:20])


def test_one_megabyte_document(pair):
    enc, tik = pair
    doc = megabyte_document()
    assert enc.encode_ordinary(doc) == tik.encode_ordinary(doc)


def test_every_code_point(pair):
    """All of Unicode in order, 128 code points per document (long runs of one class stay
    bounded, so tiktoken's quadratic BPE stays fast)."""
    enc, tik = pair
    everything = all_code_points_text()
    docs = [everything[i:i + 128] for i in range(0, len(everything), 128)]
    if enc.vocab.name.startswith("trained") and enc.vocab.pattern_name != "o200k":
        docs = docs[::4]  # the trained gpt2/cl100k twins see a quarter; o200k sees everything
    ids, offsets = enc.encode_batch_flat(docs)
    want = tik.encode_ordinary_batch(docs)
    assert offsets.tolist() == np.cumsum([0] + [len(w) for w in want]).tolist()
    assert ids.tolist() == [t for w in want for t in w]


@HYPO
@given(docs=DOCS)
def test_hypothesis_unicode_text(pair, docs):
    enc, tik = pair
    ids, offsets = enc.encode_batch_flat(docs)
    want = tik.encode_ordinary_batch(docs)
    assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(docs))] == want
    assert [enc.decode(w) for w in want] == [tik.decode(w) for w in want]


@HYPO
@given(docs=st.lists(st.binary(max_size=48), min_size=1, max_size=8))
def test_hypothesis_raw_bytes_and_round_trip(pair, docs):
    enc, tik = pair
    ids, offsets = enc.encode_batch_flat(docs)
    parts = [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(docs))]
    assert parts == [tik._encode_bytes(d) for d in docs]
    assert enc.decode_bytes_batch(parts) == docs


@HYPO
@given(text=st.text(alphabet=CHARS, max_size=80))
def test_round_trip_text(pair, text):
    enc, _ = pair
    fixed = fix_surrogates(text)  # lone surrogates become U+FFFD, as in tiktoken
    assert enc.decode(enc.encode_ordinary(text), errors="strict") == fixed


def test_special_tokens(pair):
    enc, tik = pair
    text = "x<|endoftext|>y <|endoftext|>\n\n<|endoftext|><|endoftext|>"
    for kwargs in ({"allowed_special": "all"}, {"disallowed_special": ()},
                   {"allowed_special": {"<|endoftext|>"}, "disallowed_special": ()}):
        assert enc.encode(text, **kwargs) == tik.encode(text, **kwargs)
        assert enc.encode_batch([text, "a", ""], **kwargs) == tik.encode_batch([text, "a", ""], **kwargs)
    with pytest.raises(ValueError, match="disallowed special token"):
        enc.encode(text)
    assert enc.encode_ordinary(text) == tik.encode_ordinary(text)
    assert enc.eot_token == tik.eot_token and enc.special_tokens_set == tik.special_tokens_set
    assert enc.n_vocab == tik.n_vocab and enc.max_token_value == tik.max_token_value


def test_offsets_match_tiktoken(pair):
    enc, tik = pair
    text = "héllo wörld 日本語 👩‍💻 don't\n  x"
    ids, chars = enc.encode_with_offsets(text, unit="char")
    assert (ids, chars) == (tik.encode_ordinary(text), tik.decode_with_offsets(ids)[1])
    _, byte_offsets = enc.encode_with_offsets(text, unit="byte")
    data = text.encode()
    for start, end, token in zip(byte_offsets, byte_offsets[1:] + [len(data)], ids):
        assert data[start:end] == tik.decode_single_token_bytes(token)


@pytest.mark.parametrize("pair", [v for v in VOCABS if v != "trained-custom"], indirect=True)
@pytest.mark.parametrize("chunk", [4, 7, 16, 32])
def test_small_chunks_stress_segment_boundaries(pair, device, chunk):
    """Tiny chunks: many more segments, cuts and run skips; same ids. (The custom pattern is
    pre-tokenized on the CPU: it has no GPU segments to stress.)"""
    enc, tik = pair
    assert enc.backend.on_gpu_pretok
    small = GpuEncoder(device, enc.backend.tables, enc.vocab.pattern_name, chunk=chunk)
    small.fill_invocations = 0   # this chunk size on GPUs too (not sized by the call)
    docs = TRICKY + MULTILINGUAL + corpus_docs()[:10] + [r[:700] for r in long_runs()]
    data = [d.encode() for d in docs]
    starts = np.concatenate([[0], np.cumsum([len(d) for d in data])])
    ids, offsets = small.encode_docs(b"".join(data), starts)
    want = tik.encode_ordinary_batch(docs)
    assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(docs))] == want


def test_gpu_calls_pre_tokenize_in_chunks_sized_to_fill_the_gpu(device):
    """On GPUs (unbudgeted) a call runs the shortest power-of-two chunk from SMALL_CHUNK to
    `chunk` that needs at most fill_invocations invocations; software Vulkan always `chunk`.
    Forced here on lavapipe with a small fill (inputs its loop limit allows; on a GPU the
    real encoder follows the rule too); the ids equal tiktoken's at every size."""
    vocab = vocabulary_for("trained-cl100k")
    enc, tik = get_encoding(vocab, device=device), tiktoken_twin(vocab)
    gpu_like = GpuEncoder(device, enc.backend.tables, enc.vocab.pattern_name)
    gpu_like.budget = NONE
    gpu_like.k_long_sg = None
    gpu_like.fill_invocations = 256          # 4 KB at 16 bytes, 32 KB at the chunk (128)
    assert gpu_like.chunk_for(1) == gpu_like.chunk_for(TINY_CALL_BYTES) == TINY_CHUNK
    gpu_like.tiny_call_bytes = 0
    assert [gpu_like.chunk_for(n) for n in (1, 4096, 4097, 8193, 16385, 32768, 10**9)] == \
        [SMALL_CHUNK, 16, 32, 64, 128, 128, 128]
    docs = [d for d in corpus_docs() if 200 < len(d) < 4000][:40] + TRICKY
    sizes = {}
    for nbytes in (3000, 6000, 12000, 40000):
        batch, size = [], 0
        for d in docs * 20:
            if size >= nbytes:
                break
            batch.append(d)
            size += len(d.encode())
        sizes[nbytes] = batch
    for encoder, budgeted in ((enc.backend.encoder, True), (gpu_like, False)):
        for nbytes, batch in sizes.items():
            data = [d.encode() for d in batch]
            starts = np.concatenate([[0], np.cumsum([len(d) for d in data])])
            ids, offsets = encoder.encode_docs(b"".join(data), starts)
            assert encoder.call_chunk == encoder.chunk_for(int(starts[-1]))
            if budgeted and encoder.budget != NONE:   # lavapipe's own encoder
                assert encoder.call_chunk == encoder.chunk
            want = tik.encode_ordinary_batch(batch)
            assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(batch))] == want
    assert {gpu_like.chunk_for(sum(len(d.encode()) for d in b)) for b in sizes.values()} == \
        {16, 32, 64, 128}


@pytest.mark.parametrize("pair", [v for v in VOCABS if v != "trained-custom"], indirect=True)
@pytest.mark.parametrize("chunk", [4, 16])
def test_chunks_spread_over_lanes_give_the_same_ids(pair, device, chunk):
    """A small call's pre-tokenizer chunks spread one per 2^s invocations (lane_shift; GPUs
    only by default, forced here on lavapipe, budgets included): every shift, the same ids
    as tiktoken, at segment boundaries of tiny chunks too."""
    enc, tik = pair
    spread = GpuEncoder(device, enc.backend.tables, enc.vocab.pattern_name, chunk=chunk)
    spread.fill_invocations = 0
    docs = TRICKY + MULTILINGUAL + corpus_docs()[:6] + [r[:700] for r in long_runs()]
    data = [d.encode() for d in docs]
    starts = np.concatenate([[0], np.cumsum([len(d) for d in data])])
    n_chunks = -(-int(starts[-1]) // chunk)
    want = tik.encode_ordinary_batch(docs)
    for shift in range(1, MAX_LANE_SHIFT + 1):
        spread.spread_invocations = n_chunks << shift
        assert spread.lane_shift_for(n_chunks) == shift
        ids, offsets = spread.encode_docs(b"".join(data), starts)
        assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(docs))] == want


def test_lane_shift_rule(device):
    """The largest shift up to MAX_LANE_SHIFT within spread_invocations; 0 when off (the
    software default) or when the chunks alone fill it."""
    enc = get_encoding(vocabulary_for("trained-cl100k"), device=device)
    e = GpuEncoder(device, enc.backend.tables, "cl100k")
    assert e.spread_invocations == (0 if device.info.is_software else SPREAD_INVOCATIONS)
    e.spread_invocations = 1 << 15
    assert MAX_LANE_SHIFT == 3
    assert [e.lane_shift_for(n) for n in (1, 64, 4096, 4097, 1 << 14, 1 << 15, 1 << 20)] == \
        [3, 3, 3, 2, 1, 0, 0]
    e.spread_invocations = 0
    assert e.lane_shift_for(1) == 0


def test_hundred_thousand_one_character_documents(device):
    vocab = vocabulary_for("trained-o200k")
    enc, tik = get_encoding(vocab, device=device), tiktoken_twin(vocab)
    alphabet = "ab c\n1'ſ日👍\u0301 \t"
    docs = [alphabet[i % len(alphabet)] for i in range(100_000)]
    ids, offsets = enc.encode_batch_flat(docs)
    assert offsets.size == 100_001
    assert ids.tolist() == [t for d in docs for t in tik.encode_ordinary(d)]


def test_documents_larger_than_one_call_are_split_at_boundaries(device):
    vocab = vocabulary_for("trained-cl100k")
    enc, tik = get_encoding(vocab, device=device), tiktoken_twin(vocab)
    small = GpuEncoder(device, enc.backend.tables, "cl100k", max_call_bytes=3000)
    docs = [megabyte_document()[:40_000], "tail doc", "日本語、" * 1500]
    data = [d.encode() for d in docs]
    starts = np.concatenate([[0], np.cumsum([len(d) for d in data])])
    want = tik.encode_ordinary_batch(docs)
    for packed in (b"".join(data), PackedText(data, starts)):   # joined, or range by range
        ids, offsets = small.encode_docs(packed, starts)
        assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(docs))] == want
    with pytest.raises(ValueError, match="no provable piece boundary"):
        small.encode_docs(b" " * 5000, np.array([0, 5000]))


def test_long_pieces_in_scratch_rounds(device):
    vocab = vocabulary_for("trained-gpt2")
    enc, tik = get_encoding(vocab, device=device), tiktoken_twin(vocab)
    small = GpuEncoder(device, enc.backend.tables, "gpt2")
    # forces several rounds of long pieces (a piece's windows, overlaps and retries included,
    # must fit one round: "a" * 650 in the trained vocabulary's aligned retry needs ~5,200)
    small.scratch_limit_words = 5 * 1100 + 64
    docs = ["a" * 650, "b" * 300 + " " + "c" * 200, "x" * 66, "日本" * 100]
    data = [d.encode() for d in docs]
    starts = np.concatenate([[0], np.cumsum([len(d) for d in data])])
    ids, offsets = small.encode_docs(b"".join(data), starts)
    assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(docs))] == \
        tik.encode_ordinary_batch(docs)


def test_hundred_kilobyte_word(device):
    vocab = vocabulary_for("trained-o200k")
    enc, tik = get_encoding(vocab, device=device), tiktoken_twin(vocab)
    word = ("tokenizer" * 12_000)[:100_000]
    assert enc.encode_ordinary(word) == tik.encode_ordinary(word)


def test_cpu_and_gpu_backends_agree(device):
    vocab = vocabulary_for("trained-custom")
    cpu, gpu = get_encoding(vocab, device="cpu"), get_encoding(vocab, device=device)
    docs = TRICKY + MULTILINGUAL
    assert cpu.encode_ordinary_batch(docs) == gpu.encode_ordinary_batch(docs)
    assert cpu.encode_bytes(b"ab\xffcd") == gpu.encode_bytes(b"ab\xffcd")
