"""tei.v1.Tokenize on the service's port, called by a TEI client that knows nothing of
istanbul: stubs generated at test time (grpcio-tools) from tests/data/tei.proto, a TEI-shaped
proto file, run in a process of its own (tests/data/tei_client.py) against real servers on
loopback. Replies are checked against the in-process Encoding and, for tokenizer.json with a
post-processor, against Hugging Face `tokenizers` itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from tests.service_support import (server, start_server, tiny_encoding,  # noqa: F401
                                   tiny_vocab_path)

DATA = Path(__file__).resolve().parent / "data"
TEXTS = ["hello world", "İstanbul'da sabah 🙂 日本語", "alpha <|endoftext|> beta<|fim|>", "",
         "  spaces   and\ttabs\n"]


@pytest.fixture(scope="module")
def tei_stubs(tmp_path_factory) -> Path:
    """tei_pb2.py and tei_pb2_grpc.py generated from tests/data/tei.proto, with TEI's names."""
    from grpc_tools import protoc
    out = tmp_path_factory.mktemp("tei_client")
    assert protoc.main(["protoc", f"-I{DATA}", f"--python_out={out}", f"--grpc_python_out={out}",
                        str(DATA / "tei.proto")]) == 0
    assert (out / "tei_pb2_grpc.py").is_file()
    return out


def tei_calls(stubs: Path, target: str, calls: list) -> list:
    """Run the TEI client process with `calls`; its replies as JSON."""
    done = subprocess.run([sys.executable, str(DATA / "tei_client.py"), target],
                          input=json.dumps(calls), capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(stubs), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _tokens(reply: dict) -> list:
    """SimpleToken JSON -> (id, text, special, start, stop); proto3 JSON leaves out defaults."""
    return [(t.get("id", 0), t.get("text", ""), t.get("special", False), t.get("start"),
             t.get("stop")) for t in reply.get("tokens", [])]


def expected_tokens(encoding, text: str) -> list:
    """TEI's SimpleTokens for a .tiktoken vocabulary: every special token recognised; specials
    without a range, other tokens with their byte range and text."""
    ids = encoding.encode(text, allowed_special="all")
    specials = set(encoding.vocab.special_tokens.values())
    out, at = [], 0
    for token in ids:
        data = encoding.decode_single_token_bytes(token)
        if token in specials:
            out.append((token, data.decode(), True, None, None))
        else:
            out.append((token, data.decode("utf-8", "replace"), False, at, at + len(data)))
        at += len(data)
    return out


def test_a_tei_client_tokenizes_and_decodes_unchanged(server, tiny_encoding, tei_stubs):
    enc = tiny_encoding
    ids = enc.encode(TEXTS[2], allowed_special="all")
    replies = tei_calls(tei_stubs, server.target, [
        {"rpc": "Tokenize", "requests": [{"inputs": t, "add_special_tokens": True}
                                         for t in TEXTS]},
        {"rpc": "TokenizeStream", "requests": [{"inputs": t} for t in TEXTS]},
        {"rpc": "Decode", "requests": [{"ids": ids}, {"ids": ids, "skip_special_tokens": True}]},
        {"rpc": "DecodeStream", "requests": [{"ids": ids[:3]}, {"ids": ids[3:]}]},
    ])
    tokenize, stream, decode, decode_stream = replies
    for text, reply in zip(TEXTS, tokenize):
        got = _tokens(reply)
        assert got == expected_tokens(enc, text), text   # no post-processor: nothing added
        ranges = [(a, b) for _, _, special, a, b in got if not special]
        data = text.encode()
        assert b"".join(data[a:b] for a, b in ranges) == \
            data.replace(b"<|endoftext|>", b"").replace(b"<|fim|>", b"")
    assert [_tokens(r) for r in stream] == [expected_tokens(enc, t) for t in TEXTS]
    assert [r.get("text", "") for r in decode] == [TEXTS[2], "alpha  beta"]
    assert "".join(r.get("text", "") for r in decode_stream) == TEXTS[2]


def test_tei_errors_name_the_field(server, tei_stubs):
    replies = tei_calls(tei_stubs, server.target, [
        {"rpc": "Tokenize", "requests": [{"inputs": "x", "prompt_name": "query"}]},
        {"rpc": "Decode", "requests": [{"ids": [10 ** 6]}]},
    ])
    assert replies[0]["error"] == "INVALID_ARGUMENT" and "`prompt_name`" in replies[0]["details"]
    assert replies[1]["error"] == "INVALID_ARGUMENT" and "1000000" in replies[1]["details"]


def test_reflection_and_health_list_the_tei_service(server):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
    with grpc.insecure_channel(server.target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        [answer] = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
            list_services="")]))
        names = {s.name for s in answer.list_services_response.service}
        assert {"tei.v1.Tokenize", "istanbul.tokenizer.v1.Tokenizer"} <= names
        [answer] = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
            file_containing_symbol="tei.v1.Tokenize")]))
        assert answer.file_descriptor_response.file_descriptor_proto
        status = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="tei.v1.Tokenize"), timeout=30).status
        assert status == health_pb2.HealthCheckResponse.SERVING


def _with_template(path: Path) -> Path:
    """The small tokenizer.json of test_tokenizer_hf with a BOS/EOS TemplateProcessing."""
    data = json.loads(path.read_text(encoding="utf-8"))
    ids = {a["content"]: a["id"] for a in data["added_tokens"]}
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<pad>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {name: {"id": name, "ids": [i], "tokens": [name]}
                           for name, i in ids.items()}}
    out = path.with_name("template.json")
    out.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return out


def test_add_and_skip_special_tokens_follow_the_tokenizer_json(tmp_path, device, tei_stubs):
    from tokenizers import Tokenizer
    from tests.test_tokenizer_hf import hf_file
    from tokenizer_svc.encoding import get_encoding
    from tokenizer_svc.vocab import load_vocabulary
    path = _with_template(hf_file(tmp_path, merge_syntax="string"))
    hf = Tokenizer.from_file(str(path))
    texts = ["hello world 12345", "a<|endoftext|>b<pad> 😀 ok", ""]
    encoding = get_encoding(load_vocabulary(path), device=device)
    with start_server(encoding, device) as srv:
        replies = tei_calls(tei_stubs, srv.target, [
            {"rpc": "Tokenize", "requests": [{"inputs": t, "add_special_tokens": add}
                                             for t in texts for add in (True, False)]},
            {"rpc": "Decode", "requests": [{"ids": hf.encode(t).ids, "skip_special_tokens": skip}
                                           for t in texts for skip in (True, False)]}])
    tokenize, decode = replies
    k = 0
    for text in texts:
        for add in (True, False):
            want = hf.encode(text, add_special_tokens=add)
            got = _tokens(tokenize[k])
            k += 1
            assert [t[0] for t in got] == want.ids, (text, add)
            assert [t[2] for t in got] == [i in (hf.token_to_id("<pad>"),
                                                 hf.token_to_id("<|endoftext|>"))
                                           for i in want.ids]
            for (_, token_text, special, start, stop), i in zip(got, want.ids):
                assert (start is None) == special
                if special:
                    assert token_text == hf.id_to_token(i)
    k = 0
    for text in texts:
        for skip in (True, False):
            assert decode[k].get("text", "") == hf.decode(hf.encode(text).ids,
                                                           skip_special_tokens=skip)
            k += 1


def test_tei_calls_need_the_bearer_token_like_every_other(tiny_encoding, device, tei_stubs):
    with start_server(tiny_encoding, device, auth_tokens=("s3cret",)) as srv:
        [refused] = tei_calls(tei_stubs, srv.target,
                              [{"rpc": "Tokenize", "requests": [{"inputs": "hello"}]}])
    assert refused["error"] == "UNAUTHENTICATED"
