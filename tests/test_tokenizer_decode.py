"""GPU decoding: exact bytes, strict/replace text, clear errors for ids outside the vocabulary."""

from __future__ import annotations

import numpy as np
import pytest

from tokenizer_svc.encoding import InvalidTokenError, get_encoding

from .tokenizer_support import MULTILINGUAL, SHARED, TRAINED, corpus_docs, tiktoken_twin, vocabulary_for


@pytest.fixture(scope="module", params=SHARED + TRAINED[:1])
def pair(request, device):
    vocab = vocabulary_for(request.param)
    return get_encoding(vocab, device=device), tiktoken_twin(vocab)


def test_every_token_decodes_to_its_bytes(pair):
    enc, tik = pair
    ids = sorted(enc.vocab.decoder)
    rng = np.random.default_rng(0)
    shuffled = rng.permutation(ids).tolist()
    assert enc.decode_bytes(shuffled) == tik.decode_bytes(shuffled)
    assert enc.decode_bytes([]) == b""


def test_decode_batch_and_text_modes(pair):
    enc, tik = pair
    docs = corpus_docs()[:20] + MULTILINGUAL
    batch = [tik.encode_ordinary(d) for d in docs] + [[]]
    assert enc.decode_batch(batch) == docs + [""]
    assert enc.decode_bytes_batch(batch) == [d.encode() for d in docs] + [b""]
    broken = tik.encode_ordinary("日本")[:1] or [0]
    raw = tik.decode_bytes(broken)
    if raw.decode("utf-8", errors="replace") != raw.decode("utf-8", errors="ignore"):
        assert enc.decode(broken) == raw.decode("utf-8", errors="replace") == tik.decode(broken)
        with pytest.raises(UnicodeDecodeError):
            enc.decode(broken, errors="strict")
    single = tik.encode_ordinary("é")
    assert enc.decode(single, errors="strict") == "é"


def test_invalid_ids_name_the_id_and_position(pair):
    enc, _ = pair
    for bad in (enc.n_vocab, 10**9, -1):
        with pytest.raises(InvalidTokenError) as err:
            enc.decode([1, 2, 3, bad, 4])
        assert err.value.token == bad and err.value.position == 3
        assert str(bad) in str(err.value) and "position 3" in str(err.value)
        assert isinstance(err.value, ValueError)
    with pytest.raises(InvalidTokenError) as err:
        enc.decode_batch([[1], [2, 3], [4, enc.n_vocab + 5]])
    assert err.value.document == 2 and err.value.position == 1


def test_holes_in_the_id_space_are_invalid(device):
    from tests.conftest import shared_vocab
    from tokenizer_svc.vocab import load_vocabulary
    enc = get_encoding(load_vocabulary(shared_vocab("cl100k_base.tiktoken")), device=device)
    assert 100261 not in enc.vocab.decoder  # between <|fim_suffix|> and <|endofprompt|>
    with pytest.raises(InvalidTokenError, match="100261"):
        enc.decode_bytes([100257, 100261])
    assert enc.decode([100257, 100276]) == "<|endoftext|><|endofprompt|>"


def test_large_decode_matches(device):
    vocab = vocabulary_for("trained-o200k")
    enc, tik = get_encoding(vocab, device=device), tiktoken_twin(vocab)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, len(vocab.ranks), 300_000).tolist()
    assert enc.decode_bytes(ids) == tik.decode_bytes(ids)


@pytest.mark.parametrize("bytes_per_id", [0.0, 200.0])
def test_decode_output_guess_short_or_long(pair, bytes_per_id):
    """The decoder sizes its one-submit output by a guess; a short one gathers again at the
    exact size, a long one reads only the bytes there are."""
    enc, tik = pair
    docs = ["hello world " * 50, "日本語のテキスト" * 30, "", "x"]
    batch = [np.array(tik.encode_ordinary(d), np.uint32) for d in docs]
    enc.backend.decoder.bytes_per_id = bytes_per_id
    assert enc.decode_bytes_batch(batch) == [d.encode() for d in docs]
    enc.backend.decoder.bytes_per_id = bytes_per_id
    flat = np.concatenate(batch)
    assert enc.decode_bytes(flat.tolist()) == tik.decode_bytes(flat.tolist())


def test_decode_batch_of_uint32_arrays_names_the_document_of_a_bad_id(pair):
    enc, _ = pair
    batch = [np.array([1, 2], np.uint32), np.array([3, enc.n_vocab + 7], np.uint32)]
    with pytest.raises(InvalidTokenError) as info:
        enc.decode_bytes_batch(batch)
    assert info.value.token == enc.n_vocab + 7
    assert info.value.document == 1 and info.value.position == 1


def test_decode_batch_larger_than_one_call(pair):
    enc, tik = pair
    docs = ["hello world " * 20, "", "日本語" * 40, "end"]
    batch = [np.array(tik.encode_ordinary(d), np.uint32) for d in docs]
    decoder = enc.backend.decoder
    saved, decoder.max_call_ids = decoder.max_call_ids, 7
    try:
        assert enc.decode_bytes_batch(batch) == [d.encode() for d in docs]
    finally:
        decoder.max_call_ids = saved


def test_decode_batch_packs_whole_documents_into_calls(pair, monkeypatch):
    """Several documents per call (offsets from the GPU), empty ones, one larger than a call,
    and a bad id in a later call named by its document and position there."""
    enc, tik = pair
    docs = ["hello world", "", "日本語 text", "x = [1, 2, 3]\n" * 4, "", "é" * 5, "end", "a b"]
    batch = [np.array(tik.encode_ordinary(d), np.uint32) for d in docs]
    decoder = enc.backend.decoder
    calls = []   # documents per packed call
    real_call = decoder._call
    monkeypatch.setattr(decoder, "_call", lambda ids, starts=None: calls.append(
        None if starts is None else starts.size - 1) or real_call(ids, starts))
    monkeypatch.setattr(decoder, "max_call_ids", 12)
    assert len(batch[3]) > 12 and sum(len(b) for b in batch) - len(batch[3]) > 12
    assert enc.decode_bytes_batch(batch) == [d.encode() for d in docs]
    assert None in calls and max(c or 0 for c in calls) >= 2   # split one, packed others
    bad = batch[:-1] + [np.array([5, enc.n_vocab + 3], np.uint32)]
    with pytest.raises(InvalidTokenError) as info:
        enc.decode_bytes_batch(bad)
    assert info.value.document == len(docs) - 1 and info.value.position == 1


def test_calls_whose_bytes_overflow_a_binding_are_split(pair, monkeypatch):
    """A call's bytes are known only after its scan; one larger than a binding (forced here
    with a 64-byte limit) is split, for a batch (by documents, then inside one document) and
    for a flat decode, with the same bytes."""
    enc, tik = pair
    docs = ["hello world, " * 12, "", "日本語 " * 9, "a", "x = [1, 2, 3]\n" * 3, "end."]
    batch = [np.array(tik.encode_ordinary(d), np.uint32) for d in docs]
    decoder = enc.backend.decoder
    monkeypatch.setattr(decoder, "max_out_bytes", 64)
    assert enc.decode_bytes_batch(batch) == [d.encode() for d in docs]
    flat = np.concatenate(batch)
    assert enc.decode_bytes(flat.tolist()) == "".join(docs).encode()
    bad = flat.copy()
    bad[-2] = enc.n_vocab + 11
    with pytest.raises(InvalidTokenError) as info:
        enc.decode_bytes(bad.tolist())
    assert info.value.position == flat.size - 2


def test_slices_of_one_flat_encode_decode_without_a_join(pair):
    """encode_batch_flat's ids split per document (views side by side) decode as one array
    over the same memory; anything else (reordered, a gap, a copy, other dtypes, lists) is
    joined as before, with the same bytes and the same error positions."""
    from tokenizer_svc.encoding import _adjacent_uint32
    enc, _ = pair
    docs = corpus_docs()[:12] + MULTILINGUAL + [""]
    ids, offsets = enc.encode_batch_flat(docs)
    views = [ids[offsets[i]:offsets[i + 1]] for i in range(len(docs))]
    joined = _adjacent_uint32(views)
    assert joined is not None and np.shares_memory(joined, ids)
    assert joined.tolist() == ids.tolist()
    want = [d.encode() for d in docs]
    assert enc.decode_bytes_batch(views) == want
    others = {"reordered": views[::-1], "gap": views[:3] + views[4:],
              "a copy": views[:2] + [views[2].copy()] + views[3:],
              "int64": [v.astype(np.int64) for v in views], "lists": [v.tolist() for v in views]}
    for name, batch in others.items():
        assert _adjacent_uint32(batch) is None, name
    assert enc.decode_bytes_batch(others["reordered"]) == want[::-1]
    assert enc.decode_bytes_batch(others["lists"]) == want
    bad = np.concatenate([ids[:5], np.array([enc.n_vocab + 3], np.uint32), ids[5:]])
    split = [bad[:2], bad[2:8], bad[8:]]             # the bad id is document 1's fourth
    assert _adjacent_uint32(split) is not None
    with pytest.raises(InvalidTokenError) as info:
        enc.decode_bytes_batch(split)
    assert (info.value.document, info.value.position) == (1, 3)


@pytest.mark.parametrize("bytes_per_id, piece, threads", [(0.0, 1 << 23, 1), (4.0, 1 << 23, 3),
                                                           (4.0, 1332, 1), (4.0, 1332, 3)])
def test_ids_uploaded_through_the_mapped_buffer(pair, monkeypatch, bytes_per_id, piece, threads):
    """Large calls write their ids into two persistent mappable buffers in turn, copied on
    the GPU (MAPPED_UPLOAD_IDS; forced here for every call), in pieces of at most
    upload_piece_bytes (1332: many pieces, a short last one; 333 ids, or 666 narrowed to 16
    bits), written by `threads` threads (forced for every piece): the same bytes, reused
    buffers that grow up to a piece, invalid ids still named, and the exact-size regather
    after a short guess."""
    enc, tik = pair
    decoder = enc.backend.decoder
    monkeypatch.setattr(decoder, "mapped_upload_ids", 1)
    monkeypatch.setattr(decoder, "upload_piece_bytes", piece)
    monkeypatch.setattr(decoder, "upload_threads", threads)
    monkeypatch.setattr(decoder, "parallel_upload_ids", 1)
    monkeypatch.setattr(decoder, "_uploads", [None, None])
    docs = corpus_docs()[:12] + MULTILINGUAL
    batch = [np.array(tik.encode_ordinary(d), np.uint32) for d in docs]
    for n_docs in (3, len(docs)):   # the second call grows the buffer past 32 KB
        decoder.bytes_per_id = bytes_per_id
        assert enc.decode_bytes_batch(batch[:n_docs]) == [d.encode() for d in docs[:n_docs]]
    first, second = decoder._uploads
    assert first is not None and first.nbytes <= piece
    assert (second is not None) == (piece == 1332)   # the second only for calls of many pieces
    flat = np.concatenate(batch).tolist()
    assert enc.decode_bytes(flat) == tik.decode_bytes(flat)
    with pytest.raises(InvalidTokenError) as info:
        enc.decode_bytes_batch([batch[0], np.array([7, enc.n_vocab + 1], np.uint32)])
    assert info.value.document == 1 and info.value.position == 1
    assert enc.decode_bytes(flat[:50]) == tik.decode_bytes(flat[:50])   # after an error


@pytest.mark.parametrize("mapped", [False, True])
def test_ids_narrowed_to_16_bits_for_small_vocabularies(pair, monkeypatch, mapped):
    """A vocabulary of at most 65,535 ids uploads its ids two per word (half the bytes); an
    id that does not fit 16 bits must not wrap onto a valid one (65,536 + 7 is not 7): the
    call goes again in 32-bit words and the error names the id and where it is, through
    write_buffer and through the mapped pieces alike."""
    enc, tik = pair
    decoder = enc.backend.decoder
    assert decoder.narrow_ids == (max(enc.vocab.decoder) < 0xFFFF)
    if mapped:
        monkeypatch.setattr(decoder, "mapped_upload_ids", 1)
        monkeypatch.setattr(decoder, "upload_piece_bytes", 64)
        monkeypatch.setattr(decoder, "_uploads", [None, None])
    doc = corpus_docs()[0] + MULTILINGUAL[0]
    ids = np.array(tik.encode_ordinary(doc), np.uint32)
    for n in (1, 2, 3, 33, ids.size):   # odd and even counts: the last word half empty
        assert enc.decode_bytes(ids[:n].tolist()) == tik.decode_bytes(ids[:n].tolist())
    if not decoder.narrow_ids:
        pytest.skip(f"{enc.name} has more than 65,535 ids: nothing to narrow")
    for wide in (0xFFFF, 0x10000 + 7, 0xFFFFFFFE):
        bad = ids.copy()
        bad[40] = wide
        with pytest.raises(InvalidTokenError) as info:
            enc.decode_bytes_batch_flat(bad, [0, 30, bad.size])
        assert (info.value.token, info.value.document, info.value.position) == (wide, 1, 10)
    assert enc.decode_bytes(ids.tolist()) == tik.decode_bytes(ids.tolist())   # after errors


def test_decode_bytes_batch_flat_inverts_encode_batch_flat(pair):
    """decode_bytes_batch_flat(ids, offsets) gives each document's bytes straight from
    encode_batch_flat's output (documents empty or not, offsets not starting at 0, ids of
    any integer dtype), the same as decode_bytes_batch of the slices; bad offsets and ids are
    named."""
    enc, tik = pair
    docs = corpus_docs()[:12] + MULTILINGUAL + ["", "x"]
    ids, offsets = enc.encode_batch_flat(docs)
    want = [d.encode() for d in docs]
    assert enc.decode_bytes_batch_flat(ids, offsets) == want
    assert enc.decode_bytes_batch_flat(ids.astype(np.int64), offsets.tolist()) == want
    assert enc.decode_bytes_batch_flat(ids, offsets[3:8]) == want[3:7]
    assert enc.decode_bytes_batch_flat(ids, [5]) == []
    for bad_offsets in ([], [0, ids.size + 1], [4, 2]):
        with pytest.raises(ValueError, match="offsets"):
            enc.decode_bytes_batch_flat(ids, bad_offsets)
    bad = ids.copy()
    bad[offsets[2] + 1] = enc.n_vocab + 7
    with pytest.raises(InvalidTokenError) as info:
        enc.decode_bytes_batch_flat(bad, offsets)
    assert (info.value.document, info.value.position) == (2, 1)
    with pytest.raises(InvalidTokenError) as info:
        enc.decode_bytes_batch_flat(bad.astype(np.int64), offsets[1:])
    assert (info.value.document, info.value.position) == (1, 1)
    cpu = get_encoding(enc.vocab, device="cpu")
    assert cpu.decode_bytes_batch_flat(ids, offsets) == want
