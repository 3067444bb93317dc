"""The protocol's newer fields through a real server on loopback: packed little-endian ids and
offsets, (start, end) offset pairs in bytes and characters, token texts and special flags,
counts as JSON numbers, packed detokenize input, and error messages that name
protocol fields (the Python client still speaks tiktoken's words)."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from google.protobuf import json_format

from tokenizer_svc.service.client import DisallowedSpecialError
from tokenizer_svc.reference import disallowed_message
from tokenizer_svc.service.rpc import tokenizer_pb2 as pb
from tests.service_support import (TEXTS, client, reason_of, server, stub_for,  # noqa: F401
                                   tiny_encoding, tiny_vocab_path)

SPECIAL_TEXT = "alpha <|endoftext|> beta ğü<|fim|>gamma"
ALL = pb.SpecialTokenPolicy(allow_all=True)


@pytest.fixture(scope="module")
def stub(server):
    channel, stub = stub_for(server.target)
    yield stub
    channel.close()


def expected_spans(encoding, text: str, unit: str):
    """(start, end) of each token, from the token bytes: bytes exactly; characters covering
    every character any byte of the token belongs to."""
    data = text.encode()
    char_of = np.zeros(len(data) + 1, np.int64)   # character holding each byte
    char = -1
    for i, b in enumerate(data):
        if not 0x80 <= b < 0xC0:
            char += 1
        char_of[i] = char
    spans, at = [], 0
    for token in encoding.encode(text, allowed_special="all"):
        n = len(encoding.decode_single_token_bytes(token))
        spans.append((at, at + n) if unit == "byte" else
                     (int(char_of[at]), int(char_of[at + n - 1]) + 1))
        at += n
    return spans


def test_packed_ids_equal_the_repeated_ones(stub, tiny_encoding):
    for text in TEXTS:
        plain = stub.Tokenize(pb.TokenizeRequest(text=text), timeout=60)
        packed = stub.Tokenize(pb.TokenizeRequest(text=text, format=pb.ID_FORMAT_PACKED),
                               timeout=60)
        want = list(tiny_encoding.encode(text))
        assert list(plain.ids) == want and not plain.ids_packed
        assert np.frombuffer(packed.ids_packed, "<u4").tolist() == want and not packed.ids
        assert packed.token_count == plain.token_count == len(want)


@pytest.mark.parametrize("unit, value", [("byte", pb.OFFSET_UNIT_BYTE),
                                         ("char", pb.OFFSET_UNIT_CHAR)])
def test_offset_pairs_in_bytes_and_characters(stub, tiny_encoding, unit, value):
    for text in TEXTS + [SPECIAL_TEXT]:
        want = expected_spans(tiny_encoding, text, unit)
        reply = stub.Tokenize(pb.TokenizeRequest(text=text, special=ALL, offsets=value),
                              timeout=60)
        assert list(zip(reply.starts, reply.ends)) == want, text
        packed = stub.Tokenize(pb.TokenizeRequest(text=text, special=ALL, offsets=value,
                                                  format=pb.ID_FORMAT_PACKED), timeout=60)
        pairs = np.frombuffer(packed.offsets_packed, "<u4").reshape(-1, 2)
        assert [tuple(p) for p in pairs.tolist()] == want
        assert not packed.starts and not packed.ends
    data = SPECIAL_TEXT.encode()
    reply = stub.Tokenize(pb.TokenizeRequest(text=SPECIAL_TEXT, special=ALL,
                                             offsets=pb.OFFSET_UNIT_BYTE), timeout=60)
    assert b"".join(data[a:b] for a, b in zip(reply.starts, reply.ends)) == data


def test_offset_pairs_survive_truncation_and_batches(stub, tiny_encoding):
    text = TEXTS[7]
    want = expected_spans(tiny_encoding, text, "char")
    reply = stub.Tokenize(pb.TokenizeRequest(
        text=text, offsets=pb.OFFSET_UNIT_CHAR,
        truncation=pb.Truncation(max_tokens=3, side=pb.TRUNCATION_SIDE_LEFT)), timeout=60)
    assert list(zip(reply.starts, reply.ends)) == want[-3:]
    batch = stub.TokenizeBatch(pb.TokenizeBatchRequest(texts=TEXTS, offsets=pb.OFFSET_UNIT_BYTE,
                                                       format=pb.ID_FORMAT_PACKED), timeout=60)
    ids = np.frombuffer(batch.ids_packed, "<u4")
    pairs = np.frombuffer(batch.offsets_packed, "<u4").reshape(-1, 2)
    assert list(batch.token_counts) == [len(tiny_encoding.encode(t)) for t in TEXTS]
    for k, text in enumerate(TEXTS):
        a, b = batch.doc_offsets[k], batch.doc_offsets[k + 1]
        assert ids[a:b].tolist() == list(tiny_encoding.encode(text))
        assert [tuple(p) for p in pairs[a:b].tolist()] == \
            expected_spans(tiny_encoding, text, "byte")


def test_token_texts_and_special_flags(stub, tiny_encoding):
    reply = stub.Tokenize(pb.TokenizeRequest(text=SPECIAL_TEXT, special=ALL, token_texts=True),
                          timeout=60)
    specials = set(tiny_encoding.vocab.special_tokens.values())
    assert list(reply.special) == [i in specials for i in reply.ids]
    assert any(reply.special)
    assert list(reply.texts) == [tiny_encoding.decode_single_token_bytes(i).decode(
        "utf-8", "replace") for i in reply.ids]
    assert "<|fim|>" in reply.texts
    plain = stub.Tokenize(pb.TokenizeRequest(text=SPECIAL_TEXT, special=ALL), timeout=60)
    assert not plain.texts and not plain.special   # only on request


def test_counts_are_json_numbers(stub, tiny_encoding):
    """Counts and positions are uint32: JSON numbers, not the strings of uint64."""
    reply = stub.Tokenize(pb.TokenizeRequest(text="hello world"), timeout=60)
    assert isinstance(json_format.MessageToDict(reply)["tokenCount"], int)
    count = stub.CountTokens(pb.CountTokensRequest(text="hello world"), timeout=60)
    assert isinstance(json_format.MessageToDict(count)["count"], int)
    assert count.count == reply.token_count == len(tiny_encoding.encode("hello world"))
    batch = json_format.MessageToDict(stub.TokenizeBatch(
        pb.TokenizeBatchRequest(texts=["hello world", "x"]), timeout=60))
    assert all(isinstance(v, int) for v in batch["docOffsets"] + batch["tokenCounts"])


def test_detokenize_takes_packed_ids(stub, tiny_encoding):
    ids = tiny_encoding.encode(TEXTS[2])
    packed = np.asarray(ids, "<u4").tobytes()
    reply = stub.Detokenize(pb.DetokenizeRequest(ids_packed=packed), timeout=60)
    assert reply.data == TEXTS[2].encode()
    batch = stub.DetokenizeBatch(pb.DetokenizeBatchRequest(
        ids_packed=packed + packed, seq_offsets=[0, len(ids), 2 * len(ids)]), timeout=60)
    assert list(batch.data) == [TEXTS[2].encode()] * 2
    for bad, field in ((pb.DetokenizeRequest(ids_packed=packed[:-1]), "`ids_packed`"),
                       (pb.DetokenizeRequest(ids=[1], ids_packed=packed), "`ids`")):
        with pytest.raises(grpc.RpcError) as info:
            stub.Detokenize(bad, timeout=60)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in info.value.details()


def test_errors_name_protocol_fields_not_python_arguments(stub, client):
    with pytest.raises(grpc.RpcError) as info:
        stub.Tokenize(pb.TokenizeRequest(text=SPECIAL_TEXT), timeout=60)
    details = info.value.details()
    assert reason_of(info.value) == "disallowed-special"
    assert "`special.allowed`" in details and "`special.disallow_none`" in details
    assert "allowed_special" not in details and "disallowed_special=" not in details
    with pytest.raises(grpc.RpcError) as info:
        stub.TokenizeBatch(pb.TokenizeBatchRequest(texts=["ok", SPECIAL_TEXT]), timeout=60)
    assert "`texts[1]`" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        stub.Tokenize(pb.TokenizeRequest(text="x", format=7), timeout=60)
    assert info.value.details().startswith("format:")
    # the Python client speaks tiktoken's words again, from the trailer
    with pytest.raises(DisallowedSpecialError) as local:
        client.encode(SPECIAL_TEXT)
    assert str(local.value) == disallowed_message("<|endoftext|>")


def test_a_disallowed_special_token_beyond_ascii_is_invalid_argument_naming_it(tmp_path, device):
    """gRPC metadata is printable ASCII: a special token such as DeepSeek's '<｜User｜>' went
    into the trailer as it is and the call ended INTERNAL ("Invalid metadata"). The trailer
    carries it percent-encoded; the client gives the token back as it is."""
    from tests.service_support import MULTILINGUAL, SAMPLE, start_server
    from tests.tokenizer_support import train_bpe
    from tokenizer_svc.service.client import TokenizerClient
    from tokenizer_svc.encoding import Encoding
    from tokenizer_svc.patterns import GPT2_PATTERN
    from tokenizer_svc.vocab import Vocabulary
    ranks = train_bpe([SAMPLE] + MULTILINGUAL, GPT2_PATTERN, 270)
    user = "<｜User｜>"
    vocab = Vocabulary(name="wide-specials", ranks=ranks, pattern=GPT2_PATTERN,
                       pattern_name="gpt2", special_tokens={user: len(ranks), "%41": len(ranks) + 1})
    encoding = Encoding(vocab, device=device)
    with start_server(encoding, device) as srv, TokenizerClient(srv.target, timeout=60) as c:
        for token in (user, "%41"):
            with pytest.raises(DisallowedSpecialError) as info:
                c.encode(f"hi {token} there")
            assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.token == token
            assert str(info.value) == disallowed_message(token)
        assert c.encode(f"hi {user}", allowed_special={user})[-1] == len(ranks)
