"""ApplyChatTemplate through a real server on loopback, against transformers: a server on the
DeepSeek tokenizer.json with a tokenizer_config.json beside it gives the ids and the text of
`AutoTokenizer.from_pretrained(folder).apply_chat_template(...)`; bad JSON, a template's
refusal, a vocabulary without a template and the size limit are refused clearly."""

from __future__ import annotations

import json
import sys

import grpc
import numpy as np
import pytest

from tests.chat_support import CONVERSATIONS, TOOLS, deepseek_chat_folder
from tokenizer_svc.service.client import RequestError, ServiceError, TokenizerClient
from tokenizer_svc.service.rpc import tokenizer_pb2 as pb
from tests.service_support import (server, start_server, stub_for,  # noqa: F401
                                   tiny_encoding, tiny_vocab_path)

pytest.importorskip("transformers")
pytest.importorskip("jinja2")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return deepseek_chat_folder(tmp_path_factory.mktemp("deepseek-chat"))


@pytest.fixture(scope="module")
def hf(folder):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def chat_encoding(folder, device):
    from tokenizer_svc.encoding import Encoding
    from tokenizer_svc.vocab import load_vocabulary
    # its own Encoding: get_encoding's cache could hand back one whose file is elsewhere
    return Encoding(load_vocabulary(str(folder / "tokenizer.json")), device)


@pytest.fixture(scope="module")
def chat_server(chat_encoding, device):
    from tokenizer_svc.service import Limits
    srv = start_server(chat_encoding, device, limits=Limits(max_text_bytes=4000))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def chat_client(chat_server):
    with TokenizerClient(chat_server.target, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def stub(chat_server):
    channel, stub = stub_for(chat_server.target)
    yield stub
    channel.close()


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_ids_and_text_equal_transformers(chat_client, hf, index):
    messages = CONVERSATIONS[index]
    for prompt in (False, True):
        want = hf.apply_chat_template(messages, tokenize=True, return_dict=False,
                                      add_generation_prompt=prompt)
        assert chat_client.apply_chat_template(messages, add_generation_prompt=prompt) == want
        assert chat_client.apply_chat_template(messages, add_generation_prompt=prompt,
                                               tokenize=False) == \
            hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)


def test_tools_documents_and_variables_equal_transformers(chat_client, hf):
    messages = CONVERSATIONS[2]
    for kwargs in ({"tools": TOOLS}, {"add_generation_prompt": True, "thinking": False},
                   {"tools": TOOLS, "documents": [{"title": "t", "text": "x"}], "debug": 1}):
        want = hf.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
        assert chat_client.apply_chat_template(messages, **kwargs) == want, kwargs


def test_typed_messages_packed_ids_and_get_info(stub, hf):
    messages = CONVERSATIONS[1]
    typed = [pb.ChatMessage(role=m["role"], content=m["content"]) for m in messages]
    reply = stub.ApplyChatTemplate(pb.ApplyChatTemplateRequest(
        messages=typed, add_generation_prompt=True, format=pb.ID_FORMAT_PACKED), timeout=60)
    plain = [{"role": m["role"], "content": m["content"]} for m in messages]
    want = hf.apply_chat_template(plain, tokenize=True, return_dict=False,
                                  add_generation_prompt=True)
    assert np.frombuffer(reply.ids_packed, "<u4").tolist() == want and not reply.ids
    assert reply.token_count == len(want)
    assert reply.text == hf.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
    assert list(stub.GetInfo(pb.GetInfoRequest(), timeout=30).chat_templates) == ["default"]


@pytest.mark.parametrize("request_, words", [
    (pb.ApplyChatTemplateRequest(messages_json="[{"), "`messages_json` is not valid JSON"),
    (pb.ApplyChatTemplateRequest(messages_json='{"role": "user"}'),
     "`messages_json` must be a JSON array"),
    (pb.ApplyChatTemplateRequest(messages_json='[{"role": "user", "content": "x"}]',
                                 tools_json="{}"), "`tools_json` must be a JSON array"),
    (pb.ApplyChatTemplateRequest(messages_json='[{"role": "user", "content": "x"}]',
                                 variables_json="[1]"), "`variables_json` must be a JSON object"),
    (pb.ApplyChatTemplateRequest(), "the conversation is empty"),
    (pb.ApplyChatTemplateRequest(messages=[pb.ChatMessage(role="user")],
                                 messages_json="[]"), "both `messages` and `messages_json`"),
    (pb.ApplyChatTemplateRequest(messages=[pb.ChatMessage(role="user")], template="nope"),
     "no chat template named 'nope'"),
])
def test_bad_requests_name_the_field(stub, request_, words):
    with pytest.raises(grpc.RpcError) as info:
        stub.ApplyChatTemplate(request_, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in info.value.details()


def test_a_templates_refusal_and_the_size_limit(chat_client):
    with pytest.raises(RequestError) as info:
        chat_client.apply_chat_template([{"role": "robot", "content": "beep"}])
    assert info.value.reason == "chat-template-error" and "unknown role: robot" in str(info.value)
    with pytest.raises(RequestError) as info:
        chat_client.apply_chat_template([{"role": "user", "content": "x" * 5000}])
    assert info.value.reason == "limit:max_text_bytes"
    assert "the rendered conversation" in str(info.value)


def test_a_vocabulary_without_a_template_is_failed_precondition(server):
    with TokenizerClient(server.target) as c:
        with pytest.raises(ServiceError) as info:
            c.apply_chat_template([{"role": "user", "content": "hi"}])
        assert not c.info().chat_templates
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.reason == "no-chat-template"
    assert "tokenizer_config.json" in str(info.value)


def test_a_server_without_jinja_says_what_to_install(chat_encoding, device, monkeypatch):
    monkeypatch.setitem(sys.modules, "jinja2", None)   # as if it were not installed
    with start_server(chat_encoding, device) as srv, TokenizerClient(srv.target) as c:
        with pytest.raises(ServiceError) as info:
            c.apply_chat_template([{"role": "user", "content": "hi"}])
        assert not c.info().chat_templates
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "istanbul[chat]" in str(info.value)


def test_chunk_on_the_deepseek_vocabulary(chat_client, hf):
    """Chunk with a tokenizer.json vocabulary: windows of the ids transformers gives, spans
    whose text transformers decodes to (where no window edge splits a character)."""
    text = json.dumps(CONVERSATIONS, ensure_ascii=False) * 3
    data = text.encode()
    want = hf(text, add_special_tokens=False)["input_ids"]
    windows = chat_client.chunk(text, 32, 8, allowed_special="all")
    assert windows[-1].token_end == len(want) and len(windows) > 3
    clean = 0
    for w in windows:
        assert w.ids == want[w.token_start:w.token_end]
        if w.text.encode() == data[w.byte_start:w.byte_end]:
            clean += 1
            assert hf.decode(w.ids) == w.text
    assert clean > len(windows) // 2
