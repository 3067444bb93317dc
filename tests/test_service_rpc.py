"""Every RPC through a real server on loopback, checked against the in-process Encoding."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from tokenizer_svc.service.client import InvalidTokenError, RequestError, TokenizerClient
from tokenizer_svc.service.rpc import tokenizer_pb2 as pb
from tests.service_support import (TEXTS, client, reason_of, server, start_server,  # noqa: F401
                                   stub_for, tiny_encoding, tiny_vocab_path)

SPECIAL_TEXT = "alpha <|endoftext|> beta <|fim|>gamma<|endoftext|>"


@pytest.fixture(scope="module")
def stub(server):
    channel, stub = stub_for(server.target)
    yield stub
    channel.close()


# ---- Tokenize ----------------------------------------------------------------------------------

def test_tokenize_equals_the_in_process_encoding(client, tiny_encoding):
    for text in TEXTS:
        assert client.encode(text) == list(tiny_encoding.encode(text)), text
        assert client.encode_ordinary(text) == list(tiny_encoding.encode_ordinary(text)), text


@pytest.mark.parametrize("allowed, disallowed", [
    ("all", "all"),
    ({"<|endoftext|>"}, ()),
    ({"<|fim|>"}, ()),
    (set(), ()),
    ({"<|fim|>"}, {"<|fim|>"}),
])
def test_special_token_rules_follow_the_encoding(client, tiny_encoding, allowed, disallowed):
    try:
        expected = list(tiny_encoding.encode(SPECIAL_TEXT, allowed_special=allowed,
                                             disallowed_special=disallowed))
    except ValueError as exc:
        with pytest.raises(ValueError):
            client.encode(SPECIAL_TEXT, allowed_special=allowed, disallowed_special=disallowed)
        return
    assert client.encode(SPECIAL_TEXT, allowed_special=allowed,
                         disallowed_special=disallowed) == expected


def test_disallowed_special_token_is_a_value_error_naming_the_token(client, tiny_encoding):
    with pytest.raises(ValueError):
        tiny_encoding.encode(SPECIAL_TEXT)
    with pytest.raises(RequestError) as info:
        client.encode(SPECIAL_TEXT)
    assert isinstance(info.value, ValueError)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.reason == "disallowed-special"
    assert "<|endoftext|>" in str(info.value)


def test_raw_bytes_mode_handles_invalid_utf8(client, tiny_encoding):
    for data in (b"\xff\xfe invalid \x80", "ğüş".encode()[:-1], b"ok \xc3", b"valid text"):
        assert client.encode_bytes(data) == list(tiny_encoding.encode_bytes(data)), data


def test_invalid_utf8_in_text_mode_is_invalid_argument(server, stub):
    """A client of another language can put invalid UTF-8 into the `text` string field."""
    channel, _ = stub_for(server.target)
    raw = channel.unary_unary("/istanbul.tokenizer.v1.Tokenizer/Tokenize")
    bad_text = b"\x0a\x03a\xff\xfe"  # field 1 (text), 3 bytes, not UTF-8
    with pytest.raises(grpc.RpcError) as info:
        raw(bad_text, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason_of(info.value) == "invalid-utf8"
    assert "data" in info.value.details()  # says where raw bytes go instead
    assert "`text`" in info.value.details()
    # The same bytes in the `data` field are fine.
    reply = stub.Tokenize(pb.TokenizeRequest(data=b"a\xff\xfe"), timeout=30)
    assert reply.token_count == len(reply.ids) > 0
    channel.close()


def test_invalid_utf8_errors_name_the_field(server):
    channel, _ = stub_for(server.target)
    raw = channel.unary_unary("/istanbul.tokenizer.v1.Tokenizer/Tokenize")
    bad_id = pb.TokenizeRequest(text="fine").SerializeToString() + b"\x32\x02\xff\xfe"  # id
    with pytest.raises(grpc.RpcError) as info:
        raw(bad_id, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "`id`" in info.value.details() and "`text`" not in info.value.details()
    batch = channel.unary_unary("/istanbul.tokenizer.v1.Tokenizer/TokenizeBatch")
    bad_second = pb.TokenizeBatchRequest(texts=["ok"]).SerializeToString() + b"\x0a\x01\xff"
    with pytest.raises(grpc.RpcError) as info:
        batch(bad_second, timeout=30)
    assert "`texts[1]`" in info.value.details()
    channel.close()


def test_seq_offsets_are_echoed_as_sent(stub):
    huge = 2**64 - 1
    with pytest.raises(grpc.RpcError) as info:
        stub.DetokenizeBatch(pb.DetokenizeBatchRequest(ids=[1, 2], seq_offsets=[0, huge]),
                             timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert str(huge) in info.value.details() and "-1" not in info.value.details()


@pytest.mark.parametrize("unit", ["byte", "char"])
def test_offsets_equal_the_encoding(client, tiny_encoding, unit):
    for text in TEXTS:
        ids, offsets = client.encode_with_offsets(text, unit)
        want_ids, want_offsets = tiny_encoding.encode_with_offsets(text, unit=unit)
        assert ids == list(want_ids), text
        assert offsets == [int(o) for o in want_offsets], (text, unit)


def test_truncation_right_and_left(stub, tiny_encoding):
    text = TEXTS[2] + " " + TEXTS[3]
    full = list(tiny_encoding.encode(text))
    right = stub.Tokenize(pb.TokenizeRequest(
        text=text, truncation=pb.Truncation(max_tokens=5), offsets=pb.OFFSET_UNIT_BYTE), timeout=30)
    left = stub.Tokenize(pb.TokenizeRequest(
        text=text, truncation=pb.Truncation(max_tokens=5, side=pb.TRUNCATION_SIDE_LEFT),
        offsets=pb.OFFSET_UNIT_BYTE), timeout=30)
    _, offsets = tiny_encoding.encode_with_offsets(text, unit="byte")
    assert list(right.ids) == full[:5] and list(right.starts) == [int(o) for o in offsets[:5]]
    assert list(left.ids) == full[-5:] and list(left.starts) == [int(o) for o in offsets[-5:]]
    for reply in (right, left):
        assert reply.token_count == len(full) and reply.truncated
    whole = stub.Tokenize(pb.TokenizeRequest(text=text, truncation=pb.Truncation(
        max_tokens=len(full))), timeout=30)
    assert list(whole.ids) == full and not whole.truncated


def test_request_id_is_echoed(stub):
    assert stub.Tokenize(pb.TokenizeRequest(text="x", id="req-17"), timeout=30).id == "req-17"


# ---- TokenizeBatch -----------------------------------------------------------------------------

def test_tokenize_batch_is_flat_and_equals_encode_batch_flat(stub, tiny_encoding):
    reply = stub.TokenizeBatch(pb.TokenizeBatchRequest(texts=TEXTS), timeout=60)
    want_ids, want_offsets = tiny_encoding.encode_batch_flat(TEXTS)
    assert list(reply.ids) == np.asarray(want_ids).tolist()
    assert list(reply.doc_offsets) == np.asarray(want_offsets).tolist()
    assert list(reply.token_counts) == np.diff(want_offsets).tolist()


def test_client_encode_batch_flat_mixes_text_and_bytes_in_order(server, tiny_encoding):
    docs = [TEXTS[k % len(TEXTS)] + f" {k}" for k in range(40)]
    docs[7] = b"raw \xff bytes"
    docs[21] = "ğüş".encode()
    # Small requests, so the documents travel in several TokenizeBatch calls at once.
    with TokenizerClient(server.target, batch_bytes=200, batch_docs=5, inflight=3) as c:
        ids, offsets = c.encode_batch_flat(docs)
        assert c.encode_batch(docs[:3]) == [list(tiny_encoding.encode(d)) for d in docs[:3]]
    assert ids.dtype == np.uint32 and offsets.dtype == np.int64 and offsets.size == len(docs) + 1
    for k, doc in enumerate(docs):
        want = tiny_encoding.encode_bytes(doc) if isinstance(doc, bytes) else \
            tiny_encoding.encode(doc)
        assert ids[offsets[k]:offsets[k + 1]].tolist() == list(want), k


def test_tokenize_batch_edge_cases(stub, tiny_encoding):
    empty = stub.TokenizeBatch(pb.TokenizeBatchRequest(), timeout=30)
    assert list(empty.doc_offsets) == [0] and not empty.ids
    with pytest.raises(grpc.RpcError) as info:
        stub.TokenizeBatch(pb.TokenizeBatchRequest(texts=["a"], data=[b"b"]), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as info:
        stub.TokenizeBatch(pb.TokenizeBatchRequest(texts=["fine", "bad <|fim|>"]), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "document 1" in info.value.details()
    allowed = stub.TokenizeBatch(pb.TokenizeBatchRequest(
        texts=["fine", "ok <|fim|>"], special=pb.SpecialTokenPolicy(allow_all=True),
        offsets=pb.OFFSET_UNIT_CHAR), timeout=30)
    want = list(tiny_encoding.encode("ok <|fim|>", allowed_special="all"))
    assert list(allowed.ids)[allowed.doc_offsets[1]:] == want
    assert len(allowed.starts) == len(allowed.ids)


# ---- TokenizeStream ----------------------------------------------------------------------------

def test_tokenize_stream_preserves_order(stub, tiny_encoding):
    # Long and short documents interleaved: later short ones finish no earlier than they should.
    docs = [(TEXTS[k % len(TEXTS)] * (1 + (k % 5) * 20))[: 50 + (k * 37) % 3000] for k in range(120)]
    requests = (pb.TokenizeRequest(text=d, id=str(k)) for k, d in enumerate(docs))
    replies = list(stub.TokenizeStream(requests, timeout=120))
    assert [r.id for r in replies] == [str(k) for k in range(len(docs))]
    for doc, reply in zip(docs, replies):
        assert list(reply.ids) == list(tiny_encoding.encode(doc))


def test_client_tokenize_stream(client, tiny_encoding):
    docs = (f"{TEXTS[k % len(TEXTS)]} #{k}" for k in range(150))
    out = list(client.tokenize_stream(docs, window=16))
    assert len(out) == 150
    for k, ids in enumerate(out):
        assert ids.tolist() == list(tiny_encoding.encode(f"{TEXTS[k % len(TEXTS)]} #{k}"))


def test_a_bad_stream_request_ends_the_stream_naming_it(stub):
    requests = [pb.TokenizeRequest(text=f"doc {k}") for k in range(8)]
    requests[5] = pb.TokenizeRequest(text="has <|endoftext|> in it")
    call = stub.TokenizeStream(iter(requests), timeout=60)
    got = []
    with pytest.raises(grpc.RpcError) as info:
        for reply in call:
            got.append(reply)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "stream request 5" in info.value.details()
    assert len(got) == 5  # everything before the bad request was answered, in order


# ---- CountTokens -------------------------------------------------------------------------------

def test_count_tokens(client, tiny_encoding):
    for text in TEXTS:
        assert client.count_tokens(text) == len(tiny_encoding.encode(text))
    assert client.count_tokens(SPECIAL_TEXT, allowed_special="all") == \
        len(tiny_encoding.encode(SPECIAL_TEXT, allowed_special="all"))
    assert client.count_tokens(b"\xff\xfe") == len(tiny_encoding.encode_bytes(b"\xff\xfe"))


# ---- Detokenize --------------------------------------------------------------------------------

def _invalid_utf8_ids(encoding) -> list[int]:
    return list(encoding.encode_bytes(b"ok \xff\xfe"))


def test_detokenize_returns_exact_bytes_and_text(client, stub, tiny_encoding):
    for text in TEXTS:
        ids = list(tiny_encoding.encode(text))
        assert client.decode(ids) == text
        assert client.decode_bytes(ids) == text.encode()
    broken = _invalid_utf8_ids(tiny_encoding)
    assert client.decode_bytes(broken) == tiny_encoding.decode_bytes(broken) == b"ok \xff\xfe"
    assert client.decode(broken, errors="replace") == tiny_encoding.decode(broken,
                                                                           errors="replace")
    with pytest.raises(UnicodeDecodeError):
        client.decode(broken, errors="strict")
    assert client.decode(broken) == tiny_encoding.decode(broken)  # tiktoken's default: replace
    strict = pb.DetokenizeRequest(ids=broken, mode=pb.DECODE_MODE_TEXT_STRICT)
    with pytest.raises(grpc.RpcError) as info:
        stub.Detokenize(strict, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason_of(info.value) == "invalid-utf8" and "at byte 3" in info.value.details()
    replace = stub.Detokenize(pb.DetokenizeRequest(ids=broken, mode=pb.DECODE_MODE_TEXT_REPLACE),
                              timeout=30)
    assert replace.text == "ok \ufffd\ufffd"


def test_detokenize_batch_and_stream(client, stub, tiny_encoding):
    seqs = [list(tiny_encoding.encode(t)) for t in TEXTS]
    assert client.decode_batch(seqs) == TEXTS
    assert client.decode_bytes_batch([]) == []
    replies = list(stub.DetokenizeStream(
        iter(pb.DetokenizeRequest(ids=s, id=str(k), mode=pb.DECODE_MODE_TEXT_STRICT)
             for k, s in enumerate(seqs)), timeout=60))
    assert [r.text for r in replies] == TEXTS
    assert [r.id for r in replies] == [str(k) for k in range(len(TEXTS))]


def test_invalid_ids_are_refused_naming_the_id(client, stub, tiny_encoding):
    too_big = tiny_encoding.n_vocab + 5
    with pytest.raises(InvalidTokenError) as info:
        client.decode([1, 2, too_big])
    assert isinstance(info.value, ValueError)
    assert str(too_big) in str(info.value)
    with pytest.raises(grpc.RpcError) as info:
        stub.DetokenizeBatch(pb.DetokenizeBatchRequest(ids=[1, 2, too_big], seq_offsets=[0, 2, 3]),
                             timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason_of(info.value) == "invalid-token" and "document 1" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        stub.DetokenizeBatch(pb.DetokenizeBatchRequest(ids=[1, 2, 3], seq_offsets=[0, 5, 3]),
                             timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "seq_offsets" in info.value.details()


# ---- GetInfo and reflection --------------------------------------------------------------------

def test_get_info_describes_vocabulary_limits_and_adapter(client, tiny_encoding, device):
    info = client.info()
    vocab = tiny_encoding.vocab
    assert info.vocabulary_name == "tiny" == client.name
    assert info.vocabulary_hash == vocab.content_hash
    assert info.n_vocab == tiny_encoding.n_vocab == client.n_vocab
    assert dict(info.special_tokens) == vocab.special_tokens
    assert client.special_tokens_set == set(tiny_encoding.special_tokens_set)
    assert client.eot_token == tiny_encoding.eot_token
    assert info.pattern == "gpt2"
    assert info.limits.max_text_bytes > 0 and info.limits.max_message_bytes > 0
    assert info.batching.window_ms == pytest.approx(2.0)
    assert info.adapter.name == device.info.name and info.adapter.backend


def test_server_reflection_lists_and_describes_the_service(server):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
    from google.protobuf import descriptor_pb2
    channel = grpc.insecure_channel(server.target)
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    requests = [reflection_pb2.ServerReflectionRequest(list_services=""),
                reflection_pb2.ServerReflectionRequest(
                    file_containing_symbol="istanbul.tokenizer.v1.Tokenizer")]
    listed, described = list(stub.ServerReflectionInfo(iter(requests), timeout=30))
    names = {s.name for s in listed.list_services_response.service}
    assert {"istanbul.tokenizer.v1.Tokenizer", "grpc.health.v1.Health"} <= names
    proto = descriptor_pb2.FileDescriptorProto.FromString(
        described.file_descriptor_response.file_descriptor_proto[0])
    assert proto.name == "istanbul/tokenizer/v1/tokenizer.proto"
    assert "TokenizeStream" in {m.name for m in proto.service[0].method}
    channel.close()


# ---- malformed requests and limits -------------------------------------------------------------

def test_malformed_requests_are_invalid_argument(server, stub):
    channel, _ = stub_for(server.target)
    raw = channel.unary_unary("/istanbul.tokenizer.v1.Tokenizer/Tokenize")
    with pytest.raises(grpc.RpcError) as info:
        raw(b"\xff\xff\xff\xff\xff", timeout=30)  # not a protobuf message at all
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason_of(info.value) == "malformed-request"
    assert "TokenizeRequest" in info.value.details()
    channel.close()
    for request, needle in ((pb.TokenizeRequest(), "set `text`"),
                            (pb.TokenizeRequest(text="x", offsets=9), "OffsetUnit"),
                            (pb.TokenizeRequest(text="x", truncation=pb.Truncation(side=4)),
                             "TruncationSide")):
        with pytest.raises(grpc.RpcError) as info:
            stub.Tokenize(request, timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        stub.Detokenize(pb.DetokenizeRequest(ids=[1], mode=7), timeout=30)
    assert "DecodeMode" in info.value.details()


LIMITS = dict(max_message_bytes=8192, max_text_bytes=1000, max_batch_items=4, max_decode_ids=100)


@pytest.fixture(scope="module")
def limited(tiny_encoding, device):
    from tokenizer_svc.service import Limits
    srv = start_server(tiny_encoding, device, limits=Limits(**LIMITS))
    channel, stub = stub_for(srv.target)
    yield stub
    channel.close()
    srv.stop()


@pytest.mark.parametrize("call, code, limit", [
    (lambda s: s.Tokenize(pb.TokenizeRequest(text="x" * 20000)),
     grpc.StatusCode.RESOURCE_EXHAUSTED, "max_message_bytes"),
    (lambda s: s.Tokenize(pb.TokenizeRequest(text="x" * 1001)),
     grpc.StatusCode.INVALID_ARGUMENT, "max_text_bytes"),
    (lambda s: s.Tokenize(pb.TokenizeRequest(data=b"\xff" * 1001)),
     grpc.StatusCode.INVALID_ARGUMENT, "max_text_bytes"),
    (lambda s: s.TokenizeBatch(pb.TokenizeBatchRequest(texts=["a"] * 5)),
     grpc.StatusCode.INVALID_ARGUMENT, "max_batch_items"),
    (lambda s: s.TokenizeBatch(pb.TokenizeBatchRequest(texts=["a", "é" * 501])),
     grpc.StatusCode.INVALID_ARGUMENT, "max_text_bytes"),
    (lambda s: s.Detokenize(pb.DetokenizeRequest(ids=[1] * 101)),
     grpc.StatusCode.INVALID_ARGUMENT, "max_decode_ids"),
    (lambda s: s.DetokenizeBatch(pb.DetokenizeBatchRequest(ids=[1] * 5,
                                                           seq_offsets=[0, 1, 2, 3, 4, 5])),
     grpc.StatusCode.INVALID_ARGUMENT, "max_batch_items"),
    (lambda s: s.CountTokens(pb.CountTokensRequest(text="y" * 1001)),
     grpc.StatusCode.INVALID_ARGUMENT, "max_text_bytes"),
])
def test_limits_answer_with_the_code_and_name_the_limit(limited, call, code, limit):
    with pytest.raises(grpc.RpcError) as info:
        call(limited)
    assert info.value.code() == code
    assert limit in info.value.details()
    assert reason_of(info.value) == f"limit:{limit}"
    assert f"{LIMITS[limit]:,}" in info.value.details()


def test_requests_at_the_limits_pass(limited, tiny_encoding):
    reply = limited.Tokenize(pb.TokenizeRequest(text="é" * 500), timeout=30)
    assert list(reply.ids) == list(tiny_encoding.encode("é" * 500))
    assert len(limited.TokenizeBatch(pb.TokenizeBatchRequest(texts=["a"] * 4),
                                     timeout=30).doc_offsets) == 5


# ---- a real vocabulary -------------------------------------------------------------------------

def test_real_gpt2_vocabulary_through_the_service(device):
    """gpt2 from ../shared/vocab: the service equals the in-process Encoding and tiktoken."""
    import tiktoken
    from tests.conftest import shared_vocab
    from tokenizer_svc.encoding import get_encoding
    encoding = get_encoding(str(shared_vocab("gpt2.tiktoken")), device=device)
    vocab = encoding.vocab
    reference = tiktoken.Encoding("gpt2", pat_str=vocab.pattern, mergeable_ranks=vocab.ranks,
                                  special_tokens=vocab.special_tokens)
    texts = TEXTS + ["Türkçe metin: Iğdır'da ılık bir öğleden sonra, şöyle böyle 123456789.",
                     "<|endoftext|> mid <|endoftext|>"]
    with start_server(encoding, device) as server, TokenizerClient(server.target) as client:
        assert client.n_vocab == 50257 and client.eot_token == 50256
        for text in texts:
            want = reference.encode(text, allowed_special="all")
            assert client.encode(text, allowed_special="all") == want
            assert list(encoding.encode(text, allowed_special="all")) == want
        ids, offsets = client.encode_batch_flat(texts)
        for k, text in enumerate(texts):
            assert ids[offsets[k]:offsets[k + 1]].tolist() == reference.encode_ordinary(text)
        assert client.decode_batch([reference.encode_ordinary(t) for t in texts]) == texts


def test_client_stream_raises_the_source_error_after_answering_what_came_before(client):
    def documents():
        yield "first"
        yield "second"
        raise OSError("disk on fire")

    stream = client.tokenize_stream(documents(), window=4)
    assert len(next(stream)) > 0 and len(next(stream)) > 0
    with pytest.raises(OSError, match="disk on fire"):
        next(stream)
    with pytest.raises(TypeError, match="str or bytes"):
        list(client.tokenize_stream(["ok", 42]))
