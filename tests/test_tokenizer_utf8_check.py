"""The encoder's UTF-8 check (bpe_encode.wgsl bpe_utf8_check, `encode_docs(check_utf8=True)`)
against Python's strict decoder, the oracle: valid iff `doc.decode("utf-8")` succeeds, each
document on its own. InvalidUtf8 names the first invalid byte exactly (the decoder's
`exc.start`), so every document's answer is compared, not only a batch's verdict.

A tiny `pipeline_bytes` and `max_call_bytes` put chunk and sub-document boundaries (documents
larger than one device call, cut on the host) everywhere in a few kilobytes.
"""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from istanbul.shaders.kernels.bpe.cases import (UTF8_INVALID_FORMS, UTF8_VALID_EDGES,
                                                 gpu_valid_prefixes, utf8_adversarial,
                                                 utf8_valid_prefixes)
from istanbul.shaders.kernels.bpe.encode import GpuEncoder, InvalidUtf8
from tokenizer_svc.encoding import Encoding, get_encoding

from .tokenizer_support import MULTILINGUAL, TRICKY, tiktoken_twin, vocabulary_for


@pytest.fixture(scope="module")
def encoders(device):
    """(the o200k_base Encoding's own encoder, one with ~300-byte chunks and 2 KB calls)."""
    enc = get_encoding(vocabulary_for("o200k_base"), device=device)
    small = GpuEncoder(device, enc.backend.tables, "o200k", max_call_bytes=2048)
    small.pipeline_bytes = 300
    return enc.backend.encoder, small


def _packed(docs: list[bytes]):
    starts = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    return np.frombuffer(b"".join(docs), np.uint8), starts


def _check_both(encoders, docs):
    want = utf8_valid_prefixes(docs)
    for encoder in encoders:
        assert gpu_valid_prefixes(encoder, docs).tolist() == want.tolist()


def test_every_invalid_form_and_valid_edge_everywhere(encoders):
    """Each way to fail and each boundary case Python accepts, at a document's start, middle
    (every offset around a 16-byte span) and end, characters cut across documents, empty
    documents between."""
    rng = np.random.default_rng(50)
    docs = utf8_adversarial(rng)
    assert all(utf8_valid_prefixes([f])[0] < len(f) for f in UTF8_INVALID_FORMS)
    assert all(utf8_valid_prefixes([e]).tolist() == [len(e)] for e in UTF8_VALID_EDGES)
    _check_both(encoders, docs)


def test_valid_text_in_many_scripts_is_valid(encoders):
    rng = random.Random(51)
    docs = [d.encode() for d in TRICKY + MULTILINGUAL]
    docs += ["".join(chr(rng.choice([rng.randrange(0x20, 0xD800), rng.randrange(0xE000, 0x110000)]))
                     for _ in range(rng.randrange(0, 300))).encode() for _ in range(40)]
    for encoder in encoders:
        data, starts = _packed(docs)
        ids, offsets = encoder.encode_docs(data, starts, check_utf8=True)
        plain_ids, plain_offsets = encoder.encode_docs(data, starts)
        assert ids.tolist() == plain_ids.tolist() and offsets.tolist() == plain_offsets.tolist()


@pytest.mark.parametrize("seed", range(3))
def test_random_bytes_and_flipped_bits(encoders, seed):
    rng = random.Random(seed)
    docs = [rng.randbytes(rng.randrange(0, 40)) for _ in range(40)]
    text = [m.encode() for m in MULTILINGUAL]
    for _ in range(40):
        d = bytearray(rng.choice(text))
        for _ in range(rng.randrange(0, 3)):
            d[rng.randrange(len(d))] ^= 1 << rng.randrange(8)
        docs.append(bytes(d))
    rng.shuffle(docs)
    _check_both(encoders, docs)


def test_documents_larger_than_one_call_are_checked_in_parts(encoders):
    """Documents over max_call_bytes are cut at piece boundaries inside their valid prefix:
    a valid one stays valid in every part, an invalid byte anywhere is still found where
    Python finds it."""
    _, small = encoders
    body = "".join(MULTILINGUAL).encode() * 8          # ~8 KB, many 2-4 byte characters
    assert len(body) > 3 * small.max_call_bytes
    cut = body.index(b" ", 5000)   # a character boundary
    docs = [body, b"ok", body[:cut] + b"\xff" + body[cut:], body + b"\xe6\x97",
            body[:2047] + b"\xed\xa0\x80" + body, b"\x80" + body, b"",
            body[:cut] + b"\xc0\xaf tail", body[:cut + 1] + b"\x97 tail", body[:-1]]
    assert gpu_valid_prefixes(small, docs).tolist() == utf8_valid_prefixes(docs).tolist()


def test_a_failed_check_leaves_the_encoder_ready(encoders):
    """InvalidUtf8 comes after the call ended: the next call (same encoder, same thread)
    runs, and the one after a begun call's failed finish too."""
    _, small = encoders
    docs = [b"fine " * 200, b"bad \xc0\xaf", b"more " * 300]
    with pytest.raises(InvalidUtf8) as exc:
        small.encode_docs(*_packed(docs), check_utf8=True)
    assert exc.value.position == 1000 + 4
    assert not small.busy()
    begun = small.begin_docs(*_packed([b"x \xff"]), check_utf8=True)
    with pytest.raises(InvalidUtf8):
        begun.finish()
    assert not small.busy()
    ids, offsets = small.encode_docs(*_packed([b"x y"]), check_utf8=True)
    assert offsets.tolist() == [0, ids.size] and ids.size == 2


def test_begun_calls_on_twins_check_their_own_text(device):
    """GpuBackend.begin_packed's twin encoders: an invalid call and a valid one in flight
    together, each finishing with its own answer."""
    enc = Encoding(vocabulary_for("cl100k_base"), device)
    backend, tik = enc.backend, tiktoken_twin(enc.vocab)
    bad = backend.begin_packed(*_packed([b"abc \xe6\x97"]), check_utf8=True)
    good = backend.begin_packed(*_packed([b"hello world"]), check_utf8=True)
    assert good.encoder is not bad.encoder
    ids, _ = good.finish()
    assert ids.tolist() == tik.encode_ordinary("hello world")
    with pytest.raises(InvalidUtf8):
        bad.finish()
    done = threading.Event()
    threading.Thread(target=lambda: (backend.encode_packed(*_packed([b"z"]),
                                                           check_utf8=True), done.set())).start()
    assert done.wait(30)


@pytest.mark.parametrize("gpu_from", [0, 1 << 30], ids=["gpu-check", "host-check"])
def test_bytes_input_equals_encode_bytes_either_side_of_the_threshold(device, monkeypatch,
                                                                      gpu_from):
    """`encode_batch_flat(bytes)` checks calls of at least GPU_UTF8_CHECK_BYTES on the GPU and
    smaller ones on the host; either way every document equals tiktoken's `_encode_bytes`."""
    from tokenizer_svc import encoding
    monkeypatch.setattr(encoding, "GPU_UTF8_CHECK_BYTES", gpu_from)
    enc = get_encoding(vocabulary_for("cl100k_base"), device=device)
    tik = tiktoken_twin(enc.vocab)
    docs = utf8_adversarial(np.random.default_rng(7))[::2] + [m.encode() for m in MULTILINGUAL]
    ids, offsets = enc.encode_batch_flat(docs)
    for i, doc in enumerate(docs):
        assert ids[offsets[i]:offsets[i + 1]].tolist() == tik._encode_bytes(doc), i
    valid = [m.encode() for m in MULTILINGUAL]
    assert enc.encode_batch_flat(valid)[0].tolist() == \
        [t for m in MULTILINGUAL for t in tik.encode_ordinary(m)]
