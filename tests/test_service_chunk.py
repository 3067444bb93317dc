"""Chunk and per-item errors through a real server on loopback: the windows equal
tokenizer_svc.chunking's (itself checked against tiktoken in tests/test_chunking.py) and
the server's own token offsets; bad arguments and limits are refused naming the field; with
`per_item_errors` a batch with bad items answers the good ones, the Python client returns the
bad ones' exceptions in their slots."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from tokenizer_svc.chunking import Chunk, chunk
from tokenizer_svc.service.client import (DisallowedSpecialError, InvalidTokenError, RequestError,
                                  TokenizerClient)
from tokenizer_svc.service.rpc import tokenizer_pb2 as pb
from tests.service_support import (TEXTS, client, reason_of, server, start_server,  # noqa: F401
                                   stub_for, tiny_encoding, tiny_vocab_path)

DOCS = [t for t in TEXTS if t] + ["", "İstanbul 🙂🚀 日本語 " * 30]


@pytest.fixture(scope="module")
def stub(server):
    channel, stub = stub_for(server.target)
    yield stub
    channel.close()


def windows_of(chunked) -> list:
    return [(w.token_start, w.token_end, w.start, w.end, w.byte_start, w.byte_end)
            for w in chunked.windows]


# ---- Chunk -------------------------------------------------------------------------------------

@pytest.mark.parametrize("max_tokens, overlap", [(1, 0), (5, 2), (16, 15), (4096, 0)])
def test_chunk_equals_the_library_and_the_servers_offsets(stub, tiny_encoding, max_tokens,
                                                          overlap):
    reply = stub.Chunk(pb.ChunkRequest(texts=DOCS, max_tokens=max_tokens, overlap=overlap),
                       timeout=60)
    spans = {unit: stub.TokenizeBatch(pb.TokenizeBatchRequest(texts=DOCS, offsets=value),
                                      timeout=60)
             for unit, value in (("byte", pb.OFFSET_UNIT_BYTE), ("char", pb.OFFSET_UNIT_CHAR))}
    assert len(reply.documents) == len(DOCS) and not reply.errors
    for n, (doc, chunked) in enumerate(zip(DOCS, reply.documents)):
        ids = list(tiny_encoding.encode(doc))
        assert list(chunked.ids) == ids
        want = chunk(tiny_encoding, doc, max_tokens, overlap)
        assert windows_of(chunked) == [(c.token_start, c.token_end, c.start, c.end,
                                        c.byte_start, c.byte_end) for c in want]
        lo = spans["byte"].doc_offsets[n]
        for w in chunked.windows:   # a window's span runs from its first token to its last
            first, last = lo + w.token_start, lo + w.token_end - 1
            assert (w.byte_start, w.byte_end) == (spans["byte"].starts[first],
                                                  spans["byte"].ends[last])
            assert (w.start, w.end) == (spans["char"].starts[first], spans["char"].ends[last])
            assert tiny_encoding.decode_bytes(ids[w.token_start:w.token_end]) == \
                doc.encode()[w.byte_start:w.byte_end]


def test_chunk_raw_bytes_packed_ids_and_specials(stub, tiny_encoding):
    data = [b"raw \xff\xfe bytes " * 9, "ğüş <|fim|>".encode()]
    reply = stub.Chunk(pb.ChunkRequest(data=data, max_tokens=4, overlap=1,
                                       format=pb.ID_FORMAT_PACKED), timeout=60)
    for doc, chunked in zip(data, reply.documents):
        assert not chunked.ids
        ids = np.frombuffer(chunked.ids_packed, "<u4").tolist()
        assert ids == list(tiny_encoding.encode_bytes(doc))
        assert windows_of(chunked) == [(c.token_start, c.token_end, c.start, c.end,
                                        c.byte_start, c.byte_end)
                                       for c in chunk(tiny_encoding, doc, 4, 1)]
    special = stub.Chunk(pb.ChunkRequest(texts=["a <|fim|> b"], max_tokens=2,
                                         special=pb.SpecialTokenPolicy(allow_all=True)),
                         timeout=60)
    assert list(special.documents[0].ids) == list(tiny_encoding.encode("a <|fim|> b",
                                                                       allowed_special="all"))


def test_client_chunk_equals_the_library(client, tiny_encoding):
    for doc in DOCS[:6] + [DOCS[-1], b"\xff raw bytes \xc3"]:
        assert client.chunk(doc, 6, 2) == chunk(tiny_encoding, doc, 6, 2)
    with TokenizerClient(client.target, batch_bytes=100, batch_docs=3) as small:
        got = small.chunk_batch(DOCS, 8, 3)   # several Chunk requests
    assert got == [chunk(tiny_encoding, doc, 8, 3) for doc in DOCS]
    assert isinstance(got[0][0], Chunk) and got[DOCS.index("")] == []
    with pytest.raises(ValueError, match="^overlap must be smaller"):
        client.chunk("x", 3, 3)
    with pytest.raises(DisallowedSpecialError):
        client.chunk("a <|fim|>", 3)


@pytest.mark.parametrize("request_, field", [
    (pb.ChunkRequest(texts=["x"], max_tokens=0), "`max_tokens`"),
    (pb.ChunkRequest(texts=["x"], max_tokens=4, overlap=4), "`overlap` (4) must be smaller"),
    (pb.ChunkRequest(texts=["x"], max_tokens=4, overlap=9), "`overlap` (9)"),
    (pb.ChunkRequest(texts=["x"], data=[b"y"], max_tokens=4), "both `texts` and `data`"),
    (pb.ChunkRequest(texts=["x"], max_tokens=4, format=7), "format"),
])
def test_chunk_bad_arguments_are_invalid_argument_naming_the_field(stub, request_, field):
    with pytest.raises(grpc.RpcError) as info:
        stub.Chunk(request_, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in info.value.details()
    assert reason_of(info.value) == "bad-argument"


def test_chunk_of_nothing_is_nothing(stub):
    assert not stub.Chunk(pb.ChunkRequest(max_tokens=3), timeout=30).documents
    reply = stub.Chunk(pb.ChunkRequest(texts=[""], max_tokens=3), timeout=30)
    assert len(reply.documents) == 1 and not reply.documents[0].windows


# ---- limits ------------------------------------------------------------------------------------

LIMITS = dict(max_text_bytes=100, max_batch_items=4)


@pytest.fixture(scope="module")
def limited(tiny_encoding, device):
    from tokenizer_svc.service import Limits
    srv = start_server(tiny_encoding, device, limits=Limits(**LIMITS))
    channel, stub = stub_for(srv.target)
    yield srv, stub
    channel.close()
    srv.stop()


def test_chunk_limits_name_the_limit(limited):
    _, stub = limited
    for request_, limit in ((pb.ChunkRequest(texts=["a", "b" * 101], max_tokens=2),
                             "max_text_bytes"),
                            (pb.ChunkRequest(texts=["a"] * 5, max_tokens=2), "max_batch_items")):
        with pytest.raises(grpc.RpcError) as info:
            stub.Chunk(request_, timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert reason_of(info.value) == f"limit:{limit}" and f"{LIMITS[limit]:,}" in \
            info.value.details()
    assert "`texts[1]`" in stub.Chunk(pb.ChunkRequest(
        texts=["a", "b" * 101], max_tokens=2, per_item_errors=True), timeout=30).errors[0].message


# ---- per-item errors ---------------------------------------------------------------------------

def test_tokenize_batch_per_item_errors_answer_the_good_documents(limited, tiny_encoding):
    _, stub = limited
    docs = ["fine", "bad <|fim|> one", "é" * 51, "also fine"]   # 102 bytes: over the limit
    with pytest.raises(grpc.RpcError) as info:       # the default: the call fails whole
        stub.TokenizeBatch(pb.TokenizeBatchRequest(texts=docs), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    reply = stub.TokenizeBatch(pb.TokenizeBatchRequest(texts=docs, per_item_errors=True,
                                                       offsets=pb.OFFSET_UNIT_CHAR), timeout=30)
    assert [(e.index, e.code, e.reason) for e in reply.errors] == [
        (1, grpc.StatusCode.INVALID_ARGUMENT.value[0], "disallowed-special"),
        (2, grpc.StatusCode.INVALID_ARGUMENT.value[0], "limit:max_text_bytes")]
    assert reply.errors[0].metadata["istanbul-special-token"] == "<|fim|>"
    assert "special.allowed" in reply.errors[0].message
    assert "max_text_bytes" in reply.errors[1].message and "`texts[2]`" in reply.errors[1].message
    bounds = list(reply.doc_offsets)
    for n, doc in enumerate(docs):
        got = list(reply.ids)[bounds[n]:bounds[n + 1]]
        assert got == ([] if n in (1, 2) else list(tiny_encoding.encode(doc)))
    assert list(reply.token_counts) == [len(tiny_encoding.encode("fine")), 0, 0,
                                    len(tiny_encoding.encode("also fine"))]
    assert len(reply.starts) == len(reply.ids)
    clean = stub.TokenizeBatch(pb.TokenizeBatchRequest(texts=["a", "b"], per_item_errors=True),
                               timeout=30)
    assert not clean.errors and len(clean.doc_offsets) == 3


def test_a_large_batch_scans_for_specials_off_the_loop(stub, tiny_encoding):
    docs = ["x" * 40_000, "y <|endoftext|>", "z" * 40_000]   # over SCAN_OFF_LOOP_BYTES
    reply = stub.TokenizeBatch(pb.TokenizeBatchRequest(texts=docs, per_item_errors=True),
                               timeout=60)
    assert [e.index for e in reply.errors] == [1]
    assert list(reply.ids)[reply.doc_offsets[2]:] == list(tiny_encoding.encode(docs[2]))


def test_detokenize_batch_per_item_errors(stub, tiny_encoding):
    good = list(tiny_encoding.encode("hello world"))
    n_vocab = tiny_encoding.n_vocab
    seqs = [good, [good[0], n_vocab + 5, 1], [], good]
    flat = [i for s in seqs for i in s]
    bounds = np.cumsum([0] + [len(s) for s in seqs]).tolist()
    with pytest.raises(grpc.RpcError):
        stub.DetokenizeBatch(pb.DetokenizeBatchRequest(ids=flat, seq_offsets=bounds), timeout=30)
    reply = stub.DetokenizeBatch(pb.DetokenizeBatchRequest(ids=flat, seq_offsets=bounds,
                                                           per_item_errors=True), timeout=30)
    assert list(reply.data) == [b"hello world", b"", b"", b"hello world"]
    [error] = reply.errors
    assert (error.index, error.reason) == (1, "invalid-token")
    assert error.metadata["istanbul-invalid-token"] == f"{n_vocab + 5},1,1"
    assert f"token id {n_vocab + 5} at position 1 of document 1" in error.message
    # strict text: a sequence that is not valid UTF-8 fails alone
    half = [tiny_encoding.encode_single_token(b"\xc4")]   # the first byte of "ğ"
    reply = stub.DetokenizeBatch(pb.DetokenizeBatchRequest(
        ids=good + half, seq_offsets=[0, len(good), len(good) + len(half)],
        mode=pb.DECODE_MODE_TEXT_STRICT, per_item_errors=True), timeout=30)
    assert list(reply.texts) == ["hello world", ""]
    assert [(e.index, e.reason) for e in reply.errors] == [(1, "invalid-utf8")]


def test_client_return_exceptions(limited, tiny_encoding):
    srv, _ = limited
    docs = ["fine", "bad <|fim|> one", "é" * 51, b"raw \xff", "also fine"]
    with TokenizerClient(srv.target, batch_docs=2) as c:
        with pytest.raises(DisallowedSpecialError):
            c.encode_batch(docs)
        got = c.encode_batch(docs, return_exceptions=True)
        assert got[0] == list(tiny_encoding.encode("fine"))
        assert got[3] == list(tiny_encoding.encode_bytes(b"raw \xff"))
        assert got[4] == list(tiny_encoding.encode("also fine"))
        assert isinstance(got[1], DisallowedSpecialError) and got[1].document == 1
        assert got[1].token == "<|fim|>" and "disallowed special token" in str(got[1])
        assert isinstance(got[2], RequestError) and got[2].reason == "limit:max_text_bytes"
        assert c.encode_ordinary_batch(docs[:2], return_exceptions=True) == \
            [list(tiny_encoding.encode_ordinary(d)) for d in docs[:2]]
        ok = list(tiny_encoding.encode("hello"))
        out = c.decode_batch([ok, [10 ** 6], ok], return_exceptions=True)
        assert out[0] == out[2] == "hello"
        assert isinstance(out[1], InvalidTokenError) and out[1].token == 10 ** 6
        assert out[1].document == 1
        with pytest.raises(InvalidTokenError):
            c.decode_batch([ok, [10 ** 6]])
        chunks = c.chunk_batch(["a b c", "x <|fim|>"], 2, return_exceptions=True)
        assert chunks[0] == chunk(tiny_encoding, "a b c", 2)
        assert isinstance(chunks[1], DisallowedSpecialError)


def test_auth_covers_the_new_methods(tiny_encoding, device, tmp_path):
    from tokenizer_svc.service.client import ServiceError
    with start_server(tiny_encoding, device, auth_tokens=("tok",)) as srv:
        with TokenizerClient(srv.target, retries=0) as anonymous:
            for call in (lambda: anonymous.chunk("x", 2),
                         lambda: anonymous.apply_chat_template([{"role": "user",
                                                                 "content": "x"}])):
                with pytest.raises(ServiceError) as info:
                    call()
                assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
        with TokenizerClient(srv.target, token="tok") as allowed:
            assert allowed.chunk("hello world", 2) == chunk(tiny_encoding, "hello world", 2)
