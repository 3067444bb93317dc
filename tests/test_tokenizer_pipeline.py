"""The pipelined host path of GpuEncoder: chunk and pipeline boundaries, the one-submit fast
path and its fall-backs, ids into a caller's array; ids identical to tiktoken's throughout.

A tiny `pipeline_bytes` (and `max_call_bytes`) turns a few kilobytes into dozens of chunks, so
every boundary case below crosses chunks the way 64 MB crosses 16 MB ones.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from tokenizer_svc import encoding
from tokenizer_svc.encoding import Encoding, get_encoding
from istanbul.shaders.kernels.bpe import encode as bpe_encode
from istanbul.shaders.kernels.bpe.encode import EXACT_GUESS_BYTES, GpuEncoder
from istanbul.shaders.kernels.bpe.packed_text import LazyPackedText

from .tokenizer_support import MULTILINGUAL, TRICKY, tiktoken_twin, vocabulary_for


@pytest.fixture(scope="module", params=["cl100k_base", "o200k_base"])
def chunked(request, device):
    vocab = vocabulary_for(request.param)
    enc = get_encoding(vocab, device=device)
    small = GpuEncoder(device, enc.backend.tables, enc.backend.gpu_pattern,
                       max_call_bytes=4096)
    small.pipeline_bytes = 300
    small.profile = True
    # an Encoding of its own (get_encoding's are cached and shared with other tests), whose
    # own paths go through the small chunks
    chunked_enc = Encoding(vocab, device)
    chunked_enc.backend.encoder = small
    return chunked_enc, small, tiktoken_twin(vocab)


def _docs() -> list[str]:
    rng = random.Random(21)
    docs = list(TRICKY) + list(MULTILINGUAL)
    docs += ["", "", "a", ""]                                  # empty documents between others
    docs += ["word " * rng.randrange(1, 200) for _ in range(20)]
    docs += ["x" * 900, " " * 700 + "end", "日本語" * 150]      # longer than a chunk
    docs += [""] * 30                                          # chunks of only empty documents
    docs += ["tail"]
    rng.shuffle(docs)
    return docs


def test_many_chunks_equal_tiktoken(chunked):
    enc, small, tik = chunked
    docs = _docs()
    ids, offsets = enc.encode_batch_flat(docs)
    assert small.last_profile.calls >= 10                      # it did cross many chunks
    assert offsets.size == len(docs) + 1 and offsets[-1] == ids.size
    for i, doc in enumerate(docs):
        assert ids[offsets[i]:offsets[i + 1]].tolist() == tik.encode_ordinary(doc), i


def test_documents_larger_than_one_call_are_cut_exactly(chunked):
    enc, _, tik = chunked
    doc = " ".join(f"w{i} 日本 {i * 7}" for i in range(1500)) + "\n" * 5 + "done"
    assert len(doc.encode()) > 4 * 4096
    assert enc.encode_ordinary(doc) == tik.encode_ordinary(doc)


def test_special_tokens_at_chunk_and_document_edges(chunked):
    enc, _, tik = chunked
    eot = "<|endoftext|>"
    docs = [eot, eot + "hello", "hello" + eot, eot * 3, "a" + eot + eot + "b", "", eot + " " * 400,
            ("text " * 70 + eot) * 3]
    ids, offsets = enc.encode_batch_flat(docs, allowed_special="all")
    for i, doc in enumerate(docs):
        assert ids[offsets[i]:offsets[i + 1]].tolist() == tik.encode(doc, allowed_special="all")


def test_invalid_utf8_in_bytes_mode_across_chunks(chunked):
    enc, _, tik = chunked
    rng = random.Random(22)
    docs = [rng.randbytes(rng.randrange(0, 500)) for _ in range(30)]
    docs += [b"ok \xff\xfe tail", b"\xe6\x97", "日本".encode()[:4], b"", b"\x80" * 600]
    ids, offsets = enc.encode_batch_flat(docs)
    for i, doc in enumerate(docs):
        assert ids[offsets[i]:offsets[i + 1]].tolist() == tik._encode_bytes(doc), i


def test_valid_bytes_are_checked_on_the_gpu_in_the_one_call(chunked, monkeypatch):
    """Valid `bytes` documents (many scripts, larger than one call, empty ones) go to the
    encoder as they are, its UTF-8 check in the call (no host decode); ids equal tiktoken's
    and `str` input's, also into a caller's array."""
    enc, small, tik = chunked
    from tokenizer_svc import encoding
    monkeypatch.setattr(encoding, "_pack_valid_utf8", None)   # the host check: not called
    texts = _docs() + [" ".join(f"w{i} 日本 {i * 7}" for i in range(700))]
    docs = [t.encode() for t in texts]
    assert sum(map(len, docs)) >= encoding.GPU_UTF8_CHECK_BYTES
    ids, offsets = enc.encode_batch_flat(docs)
    assert small.last_profile.gpu.get("utf8_check", 0) > 0 or \
        not small.device.has("timestamp-query")
    assert small.last_profile.calls >= 10
    for i, text in enumerate(texts):
        assert ids[offsets[i]:offsets[i + 1]].tolist() == tik.encode_ordinary(text), i
    str_ids, str_offsets = enc.encode_batch_flat(texts)
    assert ids.tolist() == str_ids.tolist() and offsets.tolist() == str_offsets.tolist()
    out = np.zeros(sum(map(len, docs)) + 5, np.uint32)
    out_ids, out_offsets = enc.encode_batch_flat(docs, out=out)
    assert out_ids.tolist() == ids.tolist() and out_offsets.tolist() == offsets.tolist()


@pytest.mark.parametrize("seed", range(2))
def test_mixed_valid_and_invalid_bytes_equal_encode_bytes(chunked, seed):
    """A batch where the GPU's check finds invalid documents among valid ones (every
    invalid form, characters cut across documents, documents larger than one call) falls
    back to the per-document path: each document equals tiktoken's `_encode_bytes`, also
    into a caller's array, and the encoder serves the next call."""
    from istanbul.shaders.kernels.bpe.cases import utf8_adversarial
    enc, small, tik = chunked
    rng = random.Random(seed)
    valid = [t.encode() for t in _docs()]
    docs = valid + utf8_adversarial(np.random.default_rng(seed))[::3]
    big = "".join(MULTILINGUAL).encode() * 5   # over max_call_bytes
    # (raw bytes after an invalid sequence are one piece: under max_call_bytes here)
    docs += [big + b"\xff end", b"\xc3" + big[:3000], big[:len(big) - 3000] + b" \xe0\x80 x"]
    rng.shuffle(docs)
    from tokenizer_svc import encoding
    assert sum(map(len, docs)) >= encoding.GPU_UTF8_CHECK_BYTES   # checked on the GPU
    ids, offsets = enc.encode_batch_flat(docs)
    for i, doc in enumerate(docs):
        assert ids[offsets[i]:offsets[i + 1]].tolist() == tik._encode_bytes(doc), i
    out = np.zeros(sum(map(len, docs)), np.uint32)
    out_ids, out_offsets = enc.encode_batch_flat(docs, out=out)
    assert out_ids.tolist() == ids.tolist() and out_offsets.tolist() == offsets.tolist()
    assert not small.busy()
    assert enc.encode_batch_flat([b"after"])[0].tolist() == tik.encode_ordinary("after")


@pytest.mark.parametrize("ids_per_byte", [0.0, 1.0])
def test_a_wrong_readback_guess_still_reads_every_id(chunked, ids_per_byte):
    """The fast path copies a guess of the ids with the offsets; a guess too small falls back
    to an exact read, one too large reads only what is there."""
    enc, small, tik = chunked
    docs = ["日本語のテキスト" * 40, "hello world " * 40, "x"]
    small.ids_per_byte = small.first_ids_per_byte = ids_per_byte
    small.exact_guess_bytes = 0   # guess even for these small chunks
    try:
        ids, offsets = small.encode_docs(*_packed(docs))
    finally:
        small.exact_guess_bytes = EXACT_GUESS_BYTES
    assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(docs))] == \
        [tik.encode_ordinary(d) for d in docs]


def test_a_calls_first_chunk_guesses_from_the_last_calls_first(chunked):
    """A batch whose first chunk holds many more ids per byte than its last (CJK first, long
    ASCII words after): the first call misses its first guess (learned from nothing like
    it) and takes a slow path; the same batch again guesses its first chunk from the
    previous call's first chunk, not its last, and takes none. Unbudgeted kernels and no
    long pieces, as on a GPU (lavapipe's budgets and long pieces take the slow path anyway)."""
    _, small, tik = chunked
    gpu_like = GpuEncoder(small.device, small.tables, small.pattern)
    gpu_like.budget = 0xFFFFFFFF          # NONE: one dispatch per kernel, as on a GPU
    gpu_like.k_long_sg = None
    gpu_like.profile = True
    gpu_like.exact_guess_bytes = 0        # guess even for these small chunks
    gpu_like.pipeline_bytes = 1200        # chunks of 300, 600, then 1200 bytes
    docs = ["日本語 のテキスト " * 12] + ["internationalization " * 12] * 8
    want = [tik.encode_ordinary(d) for d in docs]
    gpu_like.ids_per_byte = 0.05
    for slow in (True, False):
        ids, offsets = gpu_like.encode_docs(*_packed(docs))
        assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(docs))] == want
        assert gpu_like.last_profile.calls > 2
        assert (gpu_like.last_profile.slow_paths > 0) == slow, gpu_like.last_profile
    assert gpu_like.first_ids_per_byte > 2 * gpu_like.ids_per_byte


def test_small_chunks_need_no_guess_of_their_ids(chunked):
    """A chunk of at most EXACT_GUESS_BYTES copies room for one id per byte: however wrong
    the learned ids per byte, it takes no slow path (one submit, one map); guessing instead
    takes it. On lavapipe as on a GPU (unbudgeted kernels)."""
    enc, small, tik = chunked
    gpu_like = GpuEncoder(small.device, small.tables, small.pattern)
    gpu_like.budget = 0xFFFFFFFF          # NONE: one dispatch per kernel, as on a GPU
    gpu_like.k_long_sg = None
    gpu_like.profile = True
    # no long pieces: lavapipe's loop limit bounds what one unbudgeted invocation may merge
    docs = ["日本語 のテキスト " * 40, "    indented = code(x)  # " * 20, "x"]
    want = [tik.encode_ordinary(d) for d in docs]
    for exact, slow in ((EXACT_GUESS_BYTES, 0), (0, 1)):
        gpu_like.exact_guess_bytes = exact
        gpu_like.ids_per_byte = gpu_like.first_ids_per_byte = 0.0
        ids, offsets = gpu_like.encode_docs(*_packed(docs))
        assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(docs))] == want
        assert gpu_like.last_profile.slow_paths == slow


def test_ids_into_a_callers_array(chunked):
    _, small, tik = chunked
    docs = ["hello world", "", "日本語 " * 100]
    data, starts = _packed(docs)
    out = np.full(len(data) + 7, 0xDEAD, np.uint32)
    ids, offsets = small.encode_docs(data, starts, out=out)
    assert ids.base is out or np.shares_memory(ids, out)
    assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(docs))] == \
        [tik.encode_ordinary(d) for d in docs]
    assert (out[ids.size:] == 0xDEAD).all()                    # nothing written past the ids
    with pytest.raises(ValueError, match="out must be a 1-D uint32 array of at least"):
        small.encode_docs(data, starts, out=np.zeros(len(data) - 1, np.uint32))
    with pytest.raises(ValueError, match="out must be a 1-D uint32 array"):
        small.encode_docs(data, starts, out=np.zeros(len(data), np.int64))


def test_one_encoder_is_reusable_after_many_shapes(chunked):
    """Pool and staging buffers grow and are reused between calls of different sizes."""
    _, small, tik = chunked
    for docs in (["a"], ["hello " * 2000], ["", ""], ["b" * 70, "c"]):
        ids, offsets = small.encode_docs(*_packed(docs))
        assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(docs))] == \
            [tik.encode_ordinary(d) for d in docs]


def _packed(docs: list[str]):
    raw = [d.encode() for d in docs]
    return b"".join(raw), np.concatenate([[0], np.cumsum([len(r) for r in raw])])


def test_an_interrupt_between_chunks_leaves_the_encoder_usable(chunked):
    """An interrupt raised between two chunks (one mapped for readback, the next uploaded)
    ends the call; the next call maps the same staging buffers again."""
    _, small, tik = chunked
    docs = ["hello world " * 30] * 12
    calls = []

    def check():
        calls.append(1)
        if len(calls) == 3:
            raise TimeoutError("deadline")

    with pytest.raises(TimeoutError), small.interruptible(check):
        small.encode_docs(*_packed(docs))
    ids, offsets = small.encode_docs(*_packed(docs))
    assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(docs))] == \
        [tik.encode_ordinary(d) for d in docs]


def test_a_failed_upload_during_the_ids_copy_leaves_the_encoder_usable(chunked, monkeypatch):
    """Chunk k's ids leave on the copy threads while chunk k+2 is uploaded: an upload that
    fails then still lets those copies finish before chunk k's staging buffer is unmapped,
    the error reaches the caller, and the next call maps the same buffers again."""
    _, small, tik = chunked
    monkeypatch.setattr(small, "copy_threads", 3)
    monkeypatch.setattr(small, "parallel_copy_ids", 1)
    docs = ["hello world " * 30] * 12
    real, uploads = small.write_text, []

    def failing(*args):
        uploads.append(1)
        if len(uploads) == 4:
            raise OSError("upload failed")
        return real(*args)

    monkeypatch.setattr(small, "write_text", failing)
    with pytest.raises(OSError, match="upload failed"):
        small.encode_docs(*_packed(docs))
    monkeypatch.setattr(small, "write_text", real)
    ids, offsets = small.encode_docs(*_packed(docs))
    assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(docs))] == \
        [tik.encode_ordinary(d) for d in docs]


@pytest.mark.parametrize("docs", [["plain ascii", "", "only ascii here " * 50],
                                  ["naïve", "日本語", "", "mixed ascii and ü"],
                                  ["lone \ud800 surrogate", "fine"]],
                         ids=["ascii", "non-ascii", "surrogate"])
def test_texts_packed_with_one_join(chunked, docs):
    """Encoding packs str documents with one join (byte starts from the lengths); a lone
    surrogate falls back to encoding each text with tiktoken's replacement."""
    enc, _, tik = chunked
    assert enc.encode_ordinary_batch(docs) == [tik.encode_ordinary(d) for d in docs]


def test_a_big_str_batch_is_encoded_chunk_by_chunk(chunked, monkeypatch):
    """A str batch of LAZY_PACK_CHARS or more reaches the encoder unencoded: the first chunk is
    submitted before the last non-ASCII text is encoded, and each chunk learns only the
    starts it needs; the ids equal tiktoken's (empty documents, documents longer than a
    chunk, lone surrogates replaced as tiktoken replaces them). A batch the encoder cannot
    cut that way (a document that may pass max_call_bytes, or ids into a caller's array)
    is encoded first, exactly too."""
    enc, small, tik = chunked
    monkeypatch.setattr(encoding, "LAZY_PACK_CHARS", 0)
    events = []
    reach, dispatch = LazyPackedText.reach, bpe_encode._Chunk.dispatch

    def logged_reach(self, position):
        reach(self, position)
        events.append(("reach", self.known, len(self.parts)))

    def logged_dispatch(self):
        events.append(("dispatch",))
        dispatch(self)

    monkeypatch.setattr(LazyPackedText, "reach", logged_reach)
    monkeypatch.setattr(bpe_encode._Chunk, "dispatch", logged_dispatch)
    docs = _docs() + ["lone \ud800 surrogate", "\udfff日本", "naïve " * 90]
    random.Random(23).shuffle(docs)
    ids, offsets = enc.encode_batch_flat(docs)
    for i, doc in enumerate(docs):
        assert ids[offsets[i]:offsets[i + 1]].tolist() == tik.encode_ordinary(doc), i
    first = events.index(("dispatch",))
    learnt = [e[1] for e in events if e[0] == "reach"]
    assert events[first - 1][0] == "reach" and events[first - 1][1] < len(docs) / 4
    assert learnt == sorted(learnt) and learnt[-1] == len(docs)
    assert events.count(("dispatch",)) >= 10   # many chunks, each cut as it came

    events.clear()
    wide = docs + ["ü" * 1100]   # 4 bytes a character would pass max_call_bytes (4096)
    ids, offsets = enc.encode_batch_flat(wide)
    assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(wide))] == \
        [tik.encode_ordinary(d) for d in wide]
    assert events.index(("dispatch",)) > 0 and events[0][1] == len(wide)   # learnt first
    out = np.empty(sum(len(d.encode("utf-8", "replace")) for d in docs), np.uint32)
    got, offsets = enc.encode_batch_flat(docs, out=out)
    assert np.shares_memory(got, out)
    assert [got[offsets[i]:offsets[i + 1]].tolist() for i in range(len(docs))] == \
        [tik.encode_ordinary(d) for d in docs]


@pytest.mark.parametrize("window,overlap,long_wg", [(200, 32, False), (201, 32, False),
                                                    (200, 64, False), (200, 32, True),
                                                    (201, 32, True)])
def test_long_pieces_inside_the_chunks_submit(chunked, device, window, overlap, long_wg):
    """On GPUs (no loop budget) long pieces are merged, stitched and copied in the chunk's
    one submit, and only pieces whose seams failed take the slow path: window 201 is odd, so
    "x" runs never stitch and are merged with longer windows; at 200 a run after a space
    stitches at the latest on windows aligned to its first window's tokens. Overlap 64 needs
    7 words of work space per byte (32: 6). Forced here on lavapipe with inputs small enough
    for its loop limit; the same ids as the budgeted path and as tiktoken. `long_wg`: the
    windows go to bpe_merge_long_wg first (the GPUs' default), the retries' longer windows
    to the heap merge."""
    _, small, tik = chunked
    inline = GpuEncoder(device, small.tables, small.pattern, long_window=window,
                        long_overlap=overlap)
    inline.long_wg = long_wg
    assert inline.inline_words_per_byte == (7 if overlap == 64 else 6)
    inline.budget = 0xFFFFFFFF          # NONE: one dispatch per kernel, as on a GPU
    inline.k_long_sg = None
    inline.pipeline_bytes = 2000
    inline.inline_min_bytes = 0
    inline.profile = True
    docs = ["x" * 640, "short words here", "日本語" * 200, "tokenizer" * 70 + " end",
            "a " + "x" * 700]
    assert inline.inline_long_for(2000)
    ids, offsets = inline.encode_docs(*_packed(docs))
    assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(docs))] == \
        [tik.encode_ordinary(d) for d in docs]
    assert inline.last_profile.gpu.get("stitch", 0) > 0
    assert ("merge_long_wg" in inline.last_profile.gpu) == long_wg
    assert (inline.last_profile.long_widened > 0) == (window == 201)
    if window == 200:   # all seams stitch: the fast path, its windows still counted
        inline.encode_docs(*_packed(["x" * 640]))
        assert inline.last_profile.long_retried == 0 and inline.last_profile.long_windows >= 3
        # the same with a staging guess that is too short: the slow path reads the ids back
        # without merging or compacting again
        more = ["x" * 640, "日本語" * 200]
        inline.ids_per_byte = inline.first_ids_per_byte = 0.0
        inline.exact_guess_bytes = 0
        ids, offsets = inline.encode_docs(*_packed(more))
        assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(more))] == \
            [tik.encode_ordinary(d) for d in more]
        assert offsets[-1] > 16 and inline.last_profile.long_retried == 0   # guess was 16


def test_encode_batch_flat_into_a_callers_array(chunked):
    enc, _, tik = chunked
    eot = "<|endoftext|>"
    docs = ["hello world", "", "日本語 " * 100, "x" * 300]
    need = sum(len(d.encode()) for d in docs)
    out = np.full(need + 3, 7, np.uint32)
    ids, offsets = enc.encode_batch_flat(docs, out=out)
    assert np.shares_memory(ids, out)
    assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(docs))] == \
        [tik.encode_ordinary(d) for d in docs]
    # special tokens and bytes documents take the general path, then copy into out
    with_eot = docs + [eot + "a"]
    out = np.zeros(need + 20, np.uint32)
    ids, offsets = enc.encode_batch_flat(with_eot, allowed_special="all", out=out)
    assert np.shares_memory(ids, out)
    assert ids[offsets[-2]:].tolist() == tik.encode(eot + "a", allowed_special="all")
    raw = [b"\xff ok", b""]
    ids, offsets = enc.encode_batch_flat(raw, out=np.zeros(16, np.uint32))
    assert ids.tolist() == tik._encode_bytes(raw[0])
    with pytest.raises(ValueError, match="need up to"):
        enc.encode_batch_flat(docs, out=np.zeros(need - 1, np.uint32))
    with pytest.raises(ValueError, match="1-D numpy uint32"):
        enc.encode_batch_flat(docs, out=np.zeros(need, np.int32))
    with pytest.raises(ValueError, match="disallowed special"):
        enc.encode_batch_flat([eot], disallowed_special="all", out=np.zeros(64, np.uint32))


def test_new_sizes_make_no_buffers_or_bind_groups(chunked, device, monkeypatch):
    """After one call has grown the pools, calls of other (smaller) sizes reuse every buffer
    and bind group: the per-call parameters live in rewritten uniform slots, not in a new
    buffer per size (a service sees a new size on nearly every request)."""
    enc, small, tik = chunked
    monkeypatch.setattr(small, "profile", False)   # timed recordings make query buffers
    base = "The quick brown fox, 日本語, 123 + 4.5 = x;\n" * 40
    # Grow the pools to the most any smaller call can ask for. The staging and output sizes
    # follow guesses learned from the previous call (ids per byte, bytes per id), so start
    # the guesses at their maxima (earlier tests leave them anywhere); the second chunk of
    # a call (the other staging slot) learns the real ratio, so it gets a document twice
    # as long as any the loop puts there.
    small.ids_per_byte = 1.0
    decoder = enc.backend.decoder
    decoder.bytes_per_id = float(max(4, enc.backend.tables.layout["max_tok_len"]))
    enc.encode_ordinary_batch([base, base + base])
    enc.decode_bytes_batch([np.array(tik.encode_ordinary(base), np.uint32)] * 2)
    made = {"buffers": 0, "bind groups": 0}
    for name, key in (("create_buffer", "buffers"), ("create_bind_group", "bind groups")):
        real = getattr(device.raw, name)
        monkeypatch.setattr(device.raw, name, lambda *a, _r=real, _k=key, **kw: (
            made.__setitem__(_k, made[_k] + 1), _r(*a, **kw))[1])
    for n in (1, 2, 37, 300, 301, 999, 1000, 1777):
        docs = [base[:n], base[n // 2:n]]
        want = [tik.encode_ordinary(d) for d in docs]
        assert enc.encode_ordinary_batch(docs) == want
        assert enc.decode_bytes_batch([np.array(w, np.uint32) for w in want]) == \
            [d.encode() for d in docs]
    assert made == {"buffers": 0, "bind groups": 0}


def test_threads_sharing_one_encoding_with_different_sizes(chunked):
    """Calls of different sizes from several threads (each call holds the device lock; the
    uniform slots and pools are rewritten call after call): every thread gets its own ids."""
    import threading
    enc, _, tik = chunked
    texts = [("word 日本 " * (k + 1) * 13)[:50 + 97 * k] for k in range(8)]
    want = [tik.encode_ordinary(t) for t in texts]
    errors = []

    def work(k):
        try:
            for r in range(3):
                i = (k + r) % len(texts)
                got = enc.encode_ordinary_batch([texts[i], texts[-1 - i]])
                assert got == [want[i], want[-1 - i]], (k, r)
                assert enc.decode(got[0]) == texts[i]
        except Exception as exc:   # reported below, with the thread's index
            errors.append((k, exc))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_bytes_documents_packed_when_all_valid(chunked):
    """Bytes documents go to the GPU in one packed call when every one is valid UTF-8; a
    character cut between two documents (the join valid, each half not), a stray
    continuation byte or an invalid tail takes the per-document path: tiktoken's
    _encode_bytes for each either way."""
    enc, _, tik = chunked
    text = "naïve café, 日本語 and 😀 " * 9
    valid = [text.encode(), b"", "ünïcode".encode(), b"plain ascii " * 30, b""]
    cut = "é".encode()
    for docs in (valid, valid + [b"caf" + cut[:1], cut[1:] + b" ok"], [cut[1:] + b"x"] + valid,
                 valid + [b"tail \xff\xfe", b"\xe6\x97"]):
        ids, offsets = enc.encode_batch_flat(docs)
        assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(docs))] == \
            [tik._encode_bytes(d) for d in docs]


def test_a_small_request_with_a_long_piece_stays_on_the_fast_path(chunked, device, monkeypatch):
    """On GPUs, with inline_min_bytes 0, a lone small document whose one long piece (a comment
    rule of 80 dashes) needs the long-piece merge gets it in its one submit, with grids sized
    by the document (forced here on lavapipe as above): no slow-path round trips, tiktoken's
    ids."""
    _, small, tik = chunked
    gpu_like = GpuEncoder(device, small.tables, small.pattern)
    gpu_like.budget = 0xFFFFFFFF          # NONE: one dispatch per kernel, as on a GPU
    gpu_like.k_long_sg = None
    gpu_like.inline_min_bytes = 0
    assert gpu_like.inline_long_for(200)
    monkeypatch.setattr(gpu_like, "_finish_slow", lambda *a: pytest.fail("slow path taken"))
    for doc in ["# " + "-" * 80 + "\ncode = 1\n", "short, no long piece", "=" * 65]:
        ids, offsets = gpu_like.encode_docs(*_packed([doc]))
        assert ids.tolist() == tik.encode_ordinary(doc), doc


def test_small_chunks_leave_long_pieces_to_the_slow_path(chunked, device, monkeypatch):
    """By default (INLINE_MIN_BYTES) a GPU chunk under 4 KB records no long-piece dispatches:
    a lone small request waits for every dispatch of its submit, and a long piece in it is
    rare. Such a piece takes the slow path (tiktoken's ids all the same); a small document
    without one, or a chunk of at least 4 KB with one, stays on the fast path."""
    _, small, tik = chunked
    gpu_like = GpuEncoder(device, small.tables, small.pattern)
    gpu_like.budget = 0xFFFFFFFF          # NONE: one dispatch per kernel, as on a GPU
    gpu_like.k_long_sg = None
    assert gpu_like.inline_min_bytes == 4096
    assert not gpu_like.inline_long_for(4095) and gpu_like.inline_long_for(4096)
    slow = []
    finish_slow = gpu_like._finish_slow
    monkeypatch.setattr(gpu_like, "_finish_slow", lambda *a: slow.append(1) or finish_slow(*a))
    big = "# " + "-" * 80 + "\n" + "word " * 1000
    for doc, slow_paths in [("# " + "-" * 80 + "\ncode = 1\n", 1), ("short, no long piece", 0),
                            (big, 0)]:
        slow.clear()
        ids, offsets = gpu_like.encode_docs(*_packed([doc]))
        assert ids.tolist() == tik.encode_ordinary(doc), doc[:40]
        assert len(slow) == slow_paths, doc[:40]


@pytest.mark.parametrize("threads", [2, 3, 5])
def test_ids_copied_out_in_parallel_slices(chunked, monkeypatch, threads):
    """Large chunks copy their ids out of the mapped staging buffer in slices on several
    threads (PARALLEL_COPY_IDS; forced here for every chunk, slice counts that do not divide
    the ids): the same ids and offsets, into a caller's array too."""
    enc, small, tik = chunked
    monkeypatch.setattr(small, "copy_threads", threads)
    monkeypatch.setattr(small, "parallel_copy_ids", 1)
    docs = _docs()
    want = [tik.encode_ordinary(d) for d in docs]
    ids, offsets = enc.encode_batch_flat(docs)
    assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(docs))] == want
    out = np.full(sum(len(d.encode()) for d in docs) + 8, 7, np.uint32)
    got, got_offsets = enc.encode_batch_flat(docs, out=out)
    assert np.shares_memory(got, out) and np.array_equal(got, ids)
    assert np.array_equal(got_offsets, offsets)


@pytest.mark.parametrize("threads", [1, 3])
def test_text_through_the_mapped_upload_buffer(chunked, monkeypatch, threads):
    """Chunks of at least mapped_text_bytes write their text into the slot's mappable buffer
    (on `threads` threads; forced here for every chunk, sizes that are not whole words) and
    copy it in their submit: the same ids, twice in a row (the buffers are reused), and the
    byte-mode and bytes-document paths too."""
    enc, small, tik = chunked
    monkeypatch.setattr(small, "mapped_text_bytes", 1)
    monkeypatch.setattr(small, "copy_threads", threads)
    monkeypatch.setattr(small, "parallel_copy_ids", 1)
    monkeypatch.setattr(small, "_text_up", {})
    docs = _docs() + ["a", "ab", "abc", "abcde" * 41]
    want = [tik.encode_ordinary(d) for d in docs]
    for _ in range(2):
        ids, offsets = enc.encode_batch_flat(docs)
        assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(docs))] == want
    assert set(small._text_up) == {0, 1}   # both slots' buffers were used
    raw = [d.encode() for d in docs]
    ids, offsets = enc.encode_batch_flat(raw)
    assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(docs))] == want
    assert enc.encode_bytes(b"x\xff" * 301) == tik._encode_bytes(b"x\xff" * 301)
